"""Run a job on Spark in micro-batches, one Spark task per job partition.

Per batch the driver reads every partition's checkpoint (the committed input positions), plans the
input offset ranges ``[position, end)`` (``end`` = the input's end when planned) and a record limit,
and runs one Spark task per partition with work. Each Spark task (:func:`run_partition`):

1. opens a :class:`~localstate.core.runtime.TaskInstance` for its partition: stores are recovered to
   the last *committed* checkpoint, so a retried attempt always starts from committed state, and
   outputs written after it are truncated;
2. reads its own input range (no per-record traffic through the JVM), merges the inputs in event
   time order (``(ts, input, offset)``: a merge that is resumable at any cut, so the processing order
   does not depend on batch boundaries), applies each input's ``on_error`` policy and feeds the task;
3. calls ``prepare_commit()`` (stores and changelogs flushed, outputs written durably) and returns
   the checkpoint to the driver, without saving it; then closes without committing.

The driver saves the returned checkpoints only when every partition of the batch succeeded. If it
dies before, the next open trims the changelog records and truncates the outputs written after the
last saved checkpoint (:mod:`localstate.core.recovery`), so nothing is lost or counted twice.
"""

from __future__ import annotations

import heapq
import logging
import os
import pickle
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.core.runtime import TaskInstance, checkpoint_store, open_changelog_system
from localstate.core.streams import StreamSink, open_input
from localstate.core.streams.base import InputRecord, base_dir
from localstate.core.task import Envelope
from localstate.errors import InputError, LocalStateError, TaskError

__all__ = ["PartitionPlan", "BatchResult", "RunSummary", "SparkJobRunner", "run_partition", "spark_context",
           "normalize_master"]

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
    task_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class RunSummary:
    batches: list[BatchResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def records_in(self) -> int:
        return sum(b.records_in for b in self.batches)

    @property
    def records_out(self) -> int:
        return sum(b.records_out for b in self.batches)

    @property
    def lag(self) -> int:
        return self.batches[-1].lag if self.batches else 0


class _BatchInstance(TaskInstance):
    """A TaskInstance whose commits are driven by the batch: no timer or record-count commits
    inside a batch (the driver commits all partitions at batch end)."""

    def _after_call(self) -> None:
        pass


def _sort_key(ts: float | None, index: int, offset: int) -> tuple[float, int, int]:
    return (float("-inf") if ts is None else ts, index, offset)


def _keyed(records: Iterator[InputRecord], index: int, name: str, single: bool) -> Iterator[tuple[Any, str, InputRecord]]:
    if single:
        for record in records:
            yield None, name, record
        return
    for record in records:
        yield _sort_key(record.ts, index, record.offset), name, record


def run_partition(job: JobConfig, plan: PartitionPlan) -> dict[str, Any]:
    """Executor side of one batch for one partition. Returns the checkpoint (as a dict) and counts,
    or ``{"error": pickled LocalStateError}`` for deterministic failures that a retry cannot fix."""
    for path in [base_dir(job), *(Path(p) for p in job.spark.get("pythonpath", []))]:
        path = path if path.is_absolute() else base_dir(job) / path
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    started = time.perf_counter()
    partition = plan.partition
    changelogs = open_changelog_system(job)
    sink = StreamSink(job)
    instance = _BatchInstance(job, partition, changelogs, sink)
    try:
        recoveries = instance.open()
        opened = time.perf_counter()
        inputs = {name: open_input(job, name) for name in sorted(plan.ranges)}
        streams = []
        for index, name in enumerate(sorted(plan.ranges)):
            _, end = plan.ranges[name]
            records = inputs[name].read(partition, instance.position(name), end)
            streams.append(_keyed(records, index, name, len(plan.ranges) == 1))
        counts = {"in": 0, "skipped": 0, "dead": 0}
        fault = plan.fault if plan.fault and plan.fault.get("partition") == partition \
            and plan.fault.get("batch") == plan.batch else None
        limit = plan.limit
        # One input needs no merge (the common case; saves a key tuple per record).
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=lambda item: item[0])
        for _, name, record in merged:
            if limit is not None and counts["in"] >= limit:
                break
            if fault is not None and counts["in"] == fault["after"] and not os.path.exists(fault["marker"]):
                Path(fault["marker"]).write_text(f"killed pid {os.getpid()} partition {partition}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            counts["in"] += 1
            if record.error is None:
                instance.process(Envelope(name, partition, record.offset, record.key, record.value, record.ts))
                continue
            source = inputs[name]
            if source.on_error == "fail":
                raise InputError(f"bad input record ({record.error}): {str(record.raw)[:200]}", stream=name,
                                 partition=partition, offset=record.offset,
                                 hint=f"fix the record, or set on_error = 'skip' or 'dead_letter' on "
                                      f"[inputs.{name}]")
            if source.on_error == "dead_letter":
                instance.collector.send(source.dead_letter, None, {
                    "stream": name, "partition": partition, "offset": record.offset, "error": record.error,
                    "raw": record.raw})
                counts["dead"] += 1
            else:
                counts["skipped"] += 1
                log.warning("skipping bad record of %s[%d] at offset %d: %s", name, partition, record.offset,
                            record.error)
            instance.positions[name] = record.offset + 1
        processed = time.perf_counter()
        if job.window_interval is not None:
            instance.maybe_window()
        before = sink.written
        checkpoint = instance.prepare_commit()
        committed = time.perf_counter()
        return {
            "partition": partition, "checkpoint": asdict(checkpoint), "in": counts["in"],
            "out": sink.written - before, "skipped": counts["skipped"], "dead": counts["dead"],
            "restore_seconds": sum(r.seconds for r in recoveries), "replayed": sum(r.replayed for r in recoveries),
            "trimmed": sum(r.trimmed for r in recoveries), "pid": os.getpid(),
            "timings": {"open": opened - started, "process": processed - opened, "commit": committed - processed},
        }
    except (InputError, TaskError) as exc:
        # Deterministic: a retry would fail the same way. Hand the typed error to the driver.
        return {"partition": partition, "error": pickle.dumps(exc)}
    finally:
        try:
            instance.close(commit=False)
        finally:
            sink.close()
            changelogs.close()


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
                 progress: Callable[[str], None] | None = print) -> None:
        self.job = job
        self.master = master or str(job.spark.get("master", "local[*]"))
        self._context = context
        self.batch_size = batch_size if batch_size is not None else job.spark.get("batch_size")
        self.fault = fault
        self.progress = progress
        self.checkpoints = checkpoint_store(job)
        self.inputs = {name: open_input(job, name) for name in sorted(job.inputs)}
        self.sink_check = StreamSink(job)  # validates [outputs.*] on the driver, before any task runs
        self.sink_check.close()

    @property
    def context(self) -> Any:
        if self._context is None:
            conf = {k: v for k, v in self.job.spark.get("conf", {}).items()}
            self._context = spark_context(self.master, f"localstate:{self.job.name}", conf)
        return self._context

    def plan(self, batch: int) -> tuple[list[PartitionPlan], int]:
        """Plans for the partitions with input to process, and the total lag before the batch."""
        plans, lag = [], 0
        for partition in range(self.job.partitions):
            checkpoint = self.checkpoints.load(partition) or Checkpoint(partition)
            ranges = {}
            for name, source in self.inputs.items():
                start, end = checkpoint.inputs.get(name, 0), source.end_offset(partition)
                ranges[name] = (start, max(start, end))
                lag += max(0, end - start)
            if any(end > start for start, end in ranges.values()):
                plans.append(PartitionPlan(batch, partition, ranges, self.batch_size, self.fault))
        return plans, lag

    def run_batch(self, batch: int, plans: list[PartitionPlan]) -> BatchResult:
        job = self.job
        started = time.perf_counter()
        rdd = self.context.parallelize(plans, len(plans))
        results = rdd.mapPartitions(lambda items: [run_partition(job, plan) for plan in items]).collect()
        errors = [r for r in results if "error" in r]
        if errors:
            raise pickle.loads(errors[0]["error"])
        for result in results:
            data = result["checkpoint"]
            checkpoint = Checkpoint(**data)
            # The checkpoint carries the generation its task instance took at open: a newer
            # instance (a zombie attempt of a later run) makes this save fail, fenced.
            self.checkpoints.save(checkpoint, expect_generation=checkpoint.generation)
        out = BatchResult(batch, seconds=time.perf_counter() - started)
        for r in results:
            out.records_in += r["in"]
            out.records_out += r["out"]
            out.skipped += r["skipped"]
            out.dead_lettered += r["dead"]
            out.restore_seconds += r["restore_seconds"]
            out.replayed += r["replayed"]
            out.trimmed += r["trimmed"]
            for key, value in r["timings"].items():
                out.task_seconds[key] = out.task_seconds.get(key, 0.0) + value
        return out

    def run(self, batches: int | None = None) -> RunSummary:
        """Run until every input is consumed (or ``batches`` batches ran)."""
        summary = RunSummary()
        self.context  # start Spark before timing anything
        started = time.perf_counter()
        batch = 0
        while batches is None or batch < batches:
            plans, lag = self.plan(batch)
            if not plans:
                break
            try:
                result = self.run_batch(batch, plans)
            except LocalStateError:
                raise
            except Exception as exc:  # Py4JJavaError: the Spark job failed after its retries
                text = str(exc)
                tail = next((line for line in reversed(text.splitlines()) if "Error" in line), text[-300:])
                raise TaskError(f"Spark batch {batch} failed after retries: {tail.strip()[:500]}",
                                hint="see the Python traceback above; state stays at the last committed "
                                     "batch, fix the cause and run again") from exc
            result.lag = lag - result.records_in
            summary.batches.append(result)
            if self.progress is not None:
                rate = result.records_in / result.seconds if result.seconds else 0.0
                extra = f" skipped {result.skipped:,}" if result.skipped else ""
                extra += f" dead-lettered {result.dead_lettered:,}" if result.dead_lettered else ""
                extra += f" restored {result.replayed:,} trimmed {result.trimmed:,}" if result.replayed or \
                    result.trimmed else ""
                self.progress(f"batch {batch}: {len(plans)} task(s), in {result.records_in:,} out "
                              f"{result.records_out:,} in {result.seconds:.2f}s ({rate:,.0f} rec/s), lag "
                              f"{result.lag:,}{extra}")
            batch += 1
        summary.seconds = time.perf_counter() - started
        return summary

