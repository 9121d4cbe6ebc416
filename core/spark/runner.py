"""Run a job on Spark in micro-batches, one Spark task per job partition.

Per batch the driver reads every partition's checkpoint (the committed input positions), plans the
input offset ranges ``[position, end)`` (``end`` = the input's end when planned, at most
``position + batch_size``) and a record limit (``batch_size``, all inputs together), and runs one
Spark task per partition with work. With instances kept open, the tasks are slots: each claims
one of the batch's partitions, preferring the one its Python worker keeps open (:func:`run_slot`).
Each Spark task (:func:`run_partition`):

1. checks out its partition's :class:`~localstate.core.runtime.TaskInstance`: the one its Python
   worker kept open after the partition's previous batch if the driver committed exactly that batch,
   else a freshly opened one, recovered to the last *committed* checkpoint (outputs written after it
   are truncated). Either way a retried attempt starts from committed state (:mod:`.instances`);
2. reads its own input range (no per-record traffic through the JVM), merges the inputs in event
   time order (``(ts, input, offset)``: a merge that is resumable at any cut, so the processing order
   does not depend on batch boundaries), applies each input's ``on_error`` policy and feeds the task;
3. calls ``prepare_commit()`` (stores and changelogs flushed, outputs written durably) and returns
   the checkpoint to the driver, without saving it; the instance stays open in the worker.

The driver saves the returned checkpoints only when every partition of the batch succeeded. If it
dies before, the next open trims the changelog records and truncates the outputs written after the
last saved checkpoint (:mod:`localstate.core.recovery`), so nothing is lost or counted twice. At the
end of a run the driver has the workers close the instances they kept.

Each task reports where its time went (:data:`TASK_PHASES`), the driver its own (:data:`DRIVER_PHASES`).
"""

from __future__ import annotations

import heapq
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from localstate.core.changelog import Compactable
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.core.faults import crash_point
from localstate.core.runtime import PROCESS_HINT, checkpoint_store, open_changelog_system
from localstate.core.spark.failures import executor_failure, spark_failure
from localstate.core.spark.instances import (BatchInstance, checkin, checkout, claim, clear_requests, kept_partition,
                                             release_partitions)
from localstate.core.streams import StreamSink, open_input
from localstate.core.streams.base import InputRecord, InputStream
from localstate.core.task import Envelope, add_task_paths, load_task_class
from localstate.core.tracebacks import raise_task_error
from localstate.errors import InputError, LocalStateError

__all__ = ["PartitionPlan", "BatchResult", "RunSummary", "SparkJobRunner", "BatchCompaction", "run_partition",
           "run_slot", "spark_context", "normalize_master", "TASK_PHASES", "DRIVER_PHASES"]

log = logging.getLogger(__name__)

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
# Failed task attempts are retried and, if they fail for good, reported by the driver with the
# Python traceback: the executor's own copy of each stack trace is noise.
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = fatal
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = fatal
"""


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


#: Phases of a Spark task, in seconds (``timings`` of :func:`run_partition`'s result): waiting for
#: the partition lock, opening/recovering (or validating the kept instance), reading and decoding
#: input, the task's ``process()`` (with its store reads and writes), changelog appends and fsyncs,
#: the rest of the store flush (the local write), writing outputs, closing.
TASK_PHASES = ("wait", "open", "read", "process", "changelog", "store_flush", "outputs", "close")
#: Phases on the driver, per batch.
DRIVER_PHASES = ("plan", "spark", "checkpoint")

_CHUNK = 256
"""Records pulled from the inputs at a time. Small on purpose: a chunk's records must die before
Python's cyclic GC promotes them to its oldest generation, or every few thousand records trigger a
full collection of the worker's heap (measured: ~12% of a task's time with 2048-record chunks, none
with 256)."""


@dataclass
class BatchResult:
    batch: int
    records_in: int = 0
    records_out: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    lag: int = 0
    seconds: float = 0.0
    restore_seconds: float = 0.0
    replayed: int = 0
    trimmed: int = 0
    tasks: int = 0
    failed_attempts: int = 0
    """task attempts that failed and were retried by Spark (a killed worker, an I/O error)"""
    reused: int = 0
    """tasks that found their partition's instance still open in their worker"""
    task_seconds: dict[str, float] = field(default_factory=dict)
    """:data:`TASK_PHASES` summed over the batch's tasks"""
    busiest_task: float = 0.0
    """seconds of the longest task (the batch's critical path inside Spark)"""
    driver_seconds: dict[str, float] = field(default_factory=dict)
    """:data:`DRIVER_PHASES`; ``spark`` is the Spark job's wall time minus the busiest task: scheduling,
    Python worker hand-off, plan and result (de)serialization"""


@dataclass
class RunSummary:
    batches: list[BatchResult] = field(default_factory=list)
    seconds: float = 0.0
    release_seconds: float = 0.0
    """closing the instances kept open in the workers, at the end of the run"""
    compaction_rounds: int = 0
    """changelog compaction rounds completed while the job ran (:class:`BatchCompaction`)"""

    @property
    def records_in(self) -> int:
        return sum(b.records_in for b in self.batches)

    @property
    def records_out(self) -> int:
        return sum(b.records_out for b in self.batches)

    @property
    def lag(self) -> int:
        return self.batches[-1].lag if self.batches else 0

    def breakdown(self) -> dict[str, float]:
        """Where the wall time went, in seconds that add up to about :attr:`seconds`: driver phases,
        Spark overhead, and the task phases (summed over all tasks, then scaled to the batches'
        critical paths, i.e. their busiest tasks: the tasks of one batch run in parallel)."""
        out = {name: sum(b.driver_seconds.get(name, 0.0) for b in self.batches) for name in DRIVER_PHASES}
        busy = sum(b.busiest_task for b in self.batches)
        summed = {name: sum(b.task_seconds.get(name, 0.0) for b in self.batches) for name in TASK_PHASES}
        total = sum(summed.values())
        for name, value in summed.items():
            out[name] = value / total * busy if total else 0.0
        out["release"] = self.release_seconds
        return out


def _sort_key(ts: float | None, index: int, offset: int) -> tuple[float, int, int]:
    return (float("-inf") if ts is None else ts, index, offset)


def _keyed(records: Iterator[InputRecord], index: int, name: str) -> Iterator[tuple[Any, str, InputRecord]]:
    for record in records:
        yield _sort_key(record.ts, index, record.offset), name, record


def _envelope_maker() -> Callable[[str, int, int, Any, Any, float | None], Envelope]:
    """A function building ``Envelope(stream, partition, offset, key, value, timestamp)`` at about
    half the cost of the constructor: a frozen dataclass's ``__init__`` sets every field through
    ``object.__setattr__``; this sets the same slots through their descriptors. The result is an
    ordinary, equal Envelope. Falls back to the constructor if Envelope's fields ever change."""
    names = ("stream", "partition", "offset", "key", "value", "timestamp")
    if tuple(f.name for f in fields(Envelope)) != names or not all(n in Envelope.__dict__ for n in names):
        return Envelope
    s_stream, s_partition, s_offset, s_key, s_value, s_ts = (Envelope.__dict__[n].__set__ for n in names)
    new = object.__new__

    def make(stream: str, partition: int, offset: int, key: Any, value: Any, ts: float | None) -> Envelope:
        envelope = new(Envelope)
        s_stream(envelope, stream)
        s_partition(envelope, partition)
        s_offset(envelope, offset)
        s_key(envelope, key)
        s_value(envelope, value)
        s_ts(envelope, ts)
        return envelope

    return make


_envelope = _envelope_maker()


def _feed(instance: BatchInstance, plan: PartitionPlan, inputs: Mapping[str, InputStream],
          counts: dict[str, int]) -> float:
    """Read the plan's input ranges and feed the task, in order; returns the seconds spent reading
    and decoding input. The hot loop of the runtime: it calls the task directly (instead of
    ``TaskInstance.process``, which re-checks what a batch already guarantees: records start at the
    committed positions, no commits inside a batch)."""
    partition = plan.partition
    names = sorted(plan.ranges)
    streams = [inputs[name].read(partition, instance.position(name), plan.ranges[name][1]) for name in names]
    if len(streams) == 1:  # the common case needs no merge (and no sort key per record)
        items: Iterator[tuple[str, InputRecord]] = zip(repeat(names[0]), streams[0])
    else:
        merged = heapq.merge(*(_keyed(s, i, n) for i, (n, s) in enumerate(zip(names, streams))), key=itemgetter(0))
        items = ((name, record) for _, name, record in merged)
    planned = sum(max(0, end - instance.position(name)) for name, (_, end) in plan.ranges.items())
    if plan.limit is not None and planned > plan.limit:
        items = islice(items, plan.limit)
    fault = plan.fault if plan.fault and plan.fault.get("partition") == partition \
        and plan.fault.get("batch") == plan.batch else None
    process = instance.task.process  # type: ignore[union-attr]
    collector, coordinator, positions = instance.collector, instance.coordinator, instance.positions
    envelope = _envelope
    clock = time.perf_counter
    reading = 0.0
    n = 0
    while True:
        # Records are pulled in chunks so that reading and processing can be timed apart for free.
        started = clock()
        chunk = list(islice(items, _CHUNK))
        reading += clock() - started
        if not chunk:
            break
        for name, record in chunk:
            if fault is not None and n == fault["after"] and not os.path.exists(fault["marker"]):
                Path(fault["marker"]).write_text(f"killed pid {os.getpid()} partition {partition}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            n += 1
            if record.error is None:
                crash_point("process")
                try:
                    process(envelope(name, partition, record.offset, record.key, record.value, record.ts),
                            collector, coordinator)
                except (Exception, SystemExit) as exc:
                    raise_task_error(exc, "process()", stream=name, partition=partition, offset=record.offset,
                                     hint=PROCESS_HINT)
            else:
                _bad_record(inputs[name], instance, name, partition, record, counts)
            positions[name] = record.offset + 1
    counts["in"] = n
    return reading


def _bad_record(source: InputStream, instance: BatchInstance, name: str, partition: int, record: InputRecord,
                counts: dict[str, int]) -> None:
    """Apply the input's ``on_error`` policy to an undecodable or keyless record."""
    if source.on_error == "fail":
        raise InputError(f"bad input record ({_safe_text(record.error)}): {_safe_text(str(record.raw)[:200])}",
                         stream=name,
                         partition=partition, offset=record.offset,
                         hint=f"fix the record, or set on_error = 'skip' or 'dead_letter' on [inputs.{name}]")
    if source.on_error == "dead_letter":
        # error and raw come from the bad data itself: make them encodable by every output (a lone
        # surrogate would otherwise fail the dead-letter write, and the job, on every run).
        instance.collector.send(source.dead_letter, None, {
            "stream": name, "partition": partition, "offset": record.offset, "error": _safe_text(record.error),
            "raw": _safe_text(record.raw)})
        counts["dead"] += 1
    else:
        counts["skipped"] += 1
        log.warning("skipping bad record of %s[%d] at offset %d: %s", name, partition, record.offset, record.error)


def _safe_text(text: Any) -> Any:
    """``text`` with lone surrogates escaped (``\\udc80``), so that UTF-8 outputs accept it."""
    if not isinstance(text, str):
        return text if text is None else repr(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def run_partition(job: JobConfig, plan: PartitionPlan) -> dict[str, Any]:
    """Executor side of one batch for one partition. Returns the checkpoint (as a dict), counts and
    :data:`TASK_PHASES` timings, or ``{"error": pickled LocalStateError}`` for deterministic failures
    that a retry cannot fix (see :func:`~localstate.core.spark.failures.executor_failure`): the
    driver raises that error, with its Python traceback, instead of Py4J's Java one. Failures a
    retry may fix are raised, for Spark to retry the task."""
    try:
        return _run_partition(job, plan)
    except (Exception, SystemExit) as exc:
        return {"partition": plan.partition, "error": executor_failure(exc, plan.batch, plan.partition)}


def _run_partition(job: JobConfig, plan: PartitionPlan) -> dict[str, Any]:
    add_task_paths(job)
    started = time.perf_counter()
    partition = plan.partition
    lease = checkout(job, partition, plan.run_id)
    instance, clock = lease.instance, lease.clock
    changelog_start, outputs_start = clock["changelog"], clock["outputs"]
    prepared = None
    try:
        if plan.roll_changelogs:
            _roll_changelogs(instance)
        opened = time.perf_counter()
        inputs = {name: open_input(job, name) for name in sorted(plan.ranges)}
        counts = {"in": 0, "skipped": 0, "dead": 0}
        reading = _feed(instance, plan, inputs, counts)
        if job.window_interval is not None:
            instance.maybe_window()
        processed = time.perf_counter()
        changelog_in_process = clock["changelog"] - changelog_start  # spills of large batches
        before = lease.sink.written
        prepared = instance.prepare_commit()
        committed = time.perf_counter()
    finally:
        checkin(lease, prepared, keep=plan.keep_open)
    changelog = clock["changelog"] - changelog_start
    outputs = clock["outputs"] - outputs_start
    timings = {
        "wait": lease.waited, "open": opened - started - lease.waited, "read": reading,
        "process": processed - opened - reading - changelog_in_process, "changelog": changelog,
        "store_flush": committed - processed - (changelog - changelog_in_process) - outputs, "outputs": outputs,
        "close": time.perf_counter() - committed,
    }
    return {
        "partition": partition, "checkpoint": asdict(prepared), "in": counts["in"],
        "out": lease.sink.written - before, "skipped": counts["skipped"], "dead": counts["dead"],
        "restore_seconds": sum(r.seconds for r in lease.recoveries),
        "replayed": sum(r.replayed for r in lease.recoveries), "trimmed": sum(r.trimmed for r in lease.recoveries),
        "reused": lease.reused, "pid": os.getpid(), "timings": timings,
    }


def _roll_changelogs(instance: BatchInstance) -> None:
    """Seal each store's active changelog segment (changelog systems with a ``roll()`` capability).
    The instance is at its committed checkpoint here, so everything sealed is at most that."""
    for store in instance.stores.values():
        roll = getattr(store.changelog, "roll", None) if store.changelog is not None else None
        if callable(roll):
            roll()


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


def run_slot(job: JobConfig, plans: Mapping[int, PartitionPlan], claims: Path, slot: int) -> dict[str, Any]:
    """Executor side of Spark task ``slot`` of a batch whose instances are kept open: claim one of
    the batch's partitions, preferring the one this worker keeps open, and run it."""
    any_plan = next(iter(plans.values()))
    partition = claim(claims, sorted(plans), slot, kept_partition(job, any_plan.run_id))
    return run_partition(job, plans[partition])


def normalize_master(master: str, max_failures: int = 4) -> str:
    """``local`` / ``local[N]`` / ``local[*]`` never retry a failed task; give them ``max_failures``."""
    if master == "local":
        return f"local[1,{max_failures}]"
    if master.startswith("local[") and master.endswith("]") and "," not in master:
        return f"{master[:-1]},{max_failures}]"
    return master


def spark_context(master: str = "local[*]", app_name: str = "localstate",
                  conf: Mapping[str, str] | None = None) -> Any:
    """Get or create the SparkContext: quiet logs, retries on, workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import warnings

    warnings.filterwarnings("ignore", message=".*pandas.*", category=FutureWarning)
    from pyspark import SparkConf, SparkContext

    log4j = Path(tempfile.gettempdir()) / "localstate-log4j2.properties"
    if not log4j.exists() or log4j.read_text() != _LOG4J:
        log4j.write_text(_LOG4J)
    spark_conf = (SparkConf().setMaster(normalize_master(master)).setAppName(app_name)
                  .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
                  .set("spark.python.worker.reuse", "true")
                  .set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
                  .set("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}"))
    for key, value in (conf or {}).items():
        spark_conf.set(key, str(value))
    context = SparkContext.getOrCreate(spark_conf)
    context.setLogLevel("ERROR")
    return context


class SparkJobRunner:
    """Drives a job on Spark, batch by batch, committing on the driver."""

    def __init__(self, job: JobConfig, *, context: Any = None, master: str | None = None,
                 batch_size: int | None = None, fault: dict[str, Any] | None = None,
                 progress: Callable[[str], None] | None = print, keep_open: bool | None = None) -> None:
        self.job = job
        self.master = master or str(job.spark.get("master", "local[*]"))
        self._context = context
        self.batch_size = batch_size if batch_size is not None else job.spark.get("batch_size")
        self.fault = fault
        self.progress = progress
        self.keep_open = bool(job.spark.get("keep_open", True)) if keep_open is None else keep_open
        self.run_id = uuid.uuid4().hex
        self.checkpoints = checkpoint_store(job)
        self.inputs = {name: open_input(job, name) for name in sorted(job.inputs)}
        self.sink_check = StreamSink(job)  # validates [outputs.*] on the driver, before any task runs
        self.sink_check.close()
        add_task_paths(job)
        load_task_class(job.task)  # a task that cannot even be imported fails here, before Spark starts

    @property
    def _claims(self) -> Path:
        """Where the tasks of this run's batches claim their partitions."""
        return self.checkpoints.root / "claims" / self.run_id

    @property
    def context(self) -> Any:
        if self._context is None:
            conf = {k: v for k, v in self.job.spark.get("conf", {}).items()}
            self._context = spark_context(self.master, f"localstate:{self.job.name}", conf)
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

    def plan(self, batch: int) -> tuple[list[PartitionPlan], int]:
        """Plans for the partitions with input to process, and the total lag before the batch."""
        plans, lag = [], 0
        for partition in range(self.job.partitions):
            checkpoint = self.checkpoints.load(partition) or Checkpoint(partition)
            ranges = {}
            for name, source in self.inputs.items():
                start, end = checkpoint.inputs.get(name, 0), source.end_offset(partition)
                lag += max(0, end - start)
                if self.batch_size is not None:
                    # No input can give more than the limit; an exact range also lets a reader run
                    # to its end (the jsonl reader then remembers where the next batch starts).
                    end = min(end, start + int(self.batch_size))
                ranges[name] = (start, max(start, end))
            if any(end > start for start, end in ranges.values()):
                plans.append(PartitionPlan(batch, partition, ranges, self.batch_size, self.fault, self.run_id,
                                           self.keep_open))
        return plans, lag

    def run_batch(self, batch: int, plans: list[PartitionPlan]) -> BatchResult:
        """One Spark job: a task per plan; then save every checkpoint, only if all tasks succeeded."""
        job = self.job
        started = time.perf_counter()
        group = f"localstate-{self.run_id}-{batch}"
        self.context.setJobGroup(group, f"localstate {job.name} batch {batch}")
        rdd = self.context.parallelize(plans, len(plans))
        if self.keep_open:
            # Tasks are slots that claim a partition each, preferring the one their worker keeps.
            # (Each slot holds one plan; it must be consumed, or PySpark does not reuse the worker.)
            claims = self._claims / str(batch)
            by_partition = {plan.partition: plan for plan in plans}
            try:
                results = rdd.mapPartitionsWithIndex(
                    lambda slot, items: [run_slot(job, by_partition, claims, slot) for _ in items]).collect()
            finally:
                shutil.rmtree(claims, ignore_errors=True)
        else:
            results = rdd.mapPartitions(lambda items: [run_partition(job, plan) for plan in items]).collect()
        collected = time.perf_counter()
        errors = [r for r in results if "error" in r]
        if errors:
            raise pickle.loads(errors[0]["error"])
        for result in results:
            data = result["checkpoint"]
            checkpoint = Checkpoint(**data)
            # The checkpoint carries the generation its task instance took at open: a newer
            # instance (a zombie attempt of a later run) makes this save fail, fenced.
            self.checkpoints.save(checkpoint, expect_generation=checkpoint.generation)
        saved = time.perf_counter()
        out = BatchResult(batch, seconds=saved - started, tasks=len(results),
                          failed_attempts=self._failed_attempts(group))
        for r in results:
            out.records_in += r["in"]
            out.records_out += r["out"]
            out.skipped += r["skipped"]
            out.dead_lettered += r["dead"]
            out.restore_seconds += r["restore_seconds"]
            out.replayed += r["replayed"]
            out.trimmed += r["trimmed"]
            out.reused += r["reused"]
            for key, value in r["timings"].items():
                out.task_seconds[key] = out.task_seconds.get(key, 0.0) + value
            out.busiest_task = max(out.busiest_task, sum(r["timings"].values()))
        out.driver_seconds = {"spark": max(0.0, collected - started - out.busiest_task),
                              "checkpoint": saved - collected}
        return out

    def _failed_attempts(self, group: str) -> int:
        """Task attempts of the batch's Spark job that failed and were retried (the executor logs
        that would say so are silenced)."""
        tracker = self.context.statusTracker()
        failed = 0
        for job_id in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job_id)
            for stage_id in info.stageIds if info is not None else []:
                stage = tracker.getStageInfo(stage_id)
                failed += stage.numFailedTasks if stage is not None else 0
        return failed

    def run(self, batches: int | None = None) -> RunSummary:
        """Run until every input is consumed (or ``batches`` batches ran)."""
        summary = RunSummary()
        self.context  # start Spark before timing anything
        self.run_id = uuid.uuid4().hex
        partitions = range(self.job.partitions)
        clear_requests(self.checkpoints, partitions)
        self._create_changelogs()
        compaction = BatchCompaction.for_job(self.job)
        started = time.perf_counter()
        batch = 0
        try:
            while batches is None or batch < batches:
                planning = time.perf_counter()
                plans, lag = self.plan(batch)
                planned = time.perf_counter()
                if not plans:
                    break
                roll = compaction is not None and compaction.due()
                if roll:
                    plans = [replace(plan, roll_changelogs=True) for plan in plans]
                try:
                    result = self.run_batch(batch, plans)
                except LocalStateError:
                    raise
                except Exception as exc:  # Py4JJavaError: the Spark job failed after its retries
                    log.debug("Spark batch %d failed", batch, exc_info=True)
                    raise spark_failure(exc, batch) from None
                if roll:
                    compaction.start_round()  # type: ignore[union-attr]
                result.driver_seconds["plan"] = planned - planning
                result.seconds += planned - planning
                result.lag = lag - result.records_in
                summary.batches.append(result)
                if self.progress is not None:
                    self.progress(_progress_line(result, len(plans)))
                batch += 1
        finally:
            if compaction is not None:
                compaction.close()  # waits for a running round
                summary.compaction_rounds = compaction.rounds.runs
            if self.keep_open:
                releasing = time.perf_counter()
                release_partitions(self.checkpoints, partitions)
                shutil.rmtree(self._claims, ignore_errors=True)
                summary.release_seconds = time.perf_counter() - releasing
        summary.seconds = time.perf_counter() - started
        return summary


def _progress_line(result: BatchResult, tasks: int) -> str:
    rate = result.records_in / result.seconds if result.seconds else 0.0
    extra = f" skipped {result.skipped:,}" if result.skipped else ""
    extra += f" dead-lettered {result.dead_lettered:,}" if result.dead_lettered else ""
    extra += f" restored {result.replayed:,} trimmed {result.trimmed:,}" if result.replayed or result.trimmed else ""
    extra += f" ({result.failed_attempts} failed task attempt(s) retried)" if result.failed_attempts else ""
    return (f"batch {result.batch}: {tasks} task(s), in {result.records_in:,} out {result.records_out:,} in "
            f"{result.seconds:.2f}s ({rate:,.0f} rec/s), lag {result.lag:,}{extra}")
