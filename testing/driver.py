"""``TaskTestDriver``: unit-test a StreamTask without Spark, on the real engines and changelogs.

    driver = TaskTestDriver(PageViewCounter, stores={"counts": {"engine": "kv", "key_serde": "string",
                                                                "value_serde": "int"}})
    driver.send("page-views", "alice", {"page": "/"})
    driver.commit()
    driver.crash(); driver.restart()        # uncommitted work is rolled back and its inputs replayed
    assert driver.store("counts").get("alice") == 1

Inputs are kept as a replayable log per stream partition, like Kafka: after ``restart()`` every
record after the checkpointed position is delivered again.

Time: processing time is the driver's clock (:attr:`TaskTestDriver.now`, moved by
:meth:`~TaskTestDriver.advance`), event time each partition's watermark (moved by the records' timestamps and
:meth:`~TaskTestDriver.advance_event_time`). Due timers fire after each send and at each advance and commit:

    driver = TaskTestDriver(Task, time={"timers": True, "allowed_lateness": "5s"})
    driver.send("clicks", "alice", 1, timestamp=100.0)
    driver.advance_event_time(200.0)          # event-time timers up to 200 fire
    driver.advance(60)                        # processing-time timers up to now + 60 fire

Bad records (undecodable, keyless) go through the input's ``on_error`` policy exactly as on Spark,
through the same feed loop (:meth:`~localstate.runtime.partition.instance.TaskInstance.feed`):

    driver = TaskTestDriver(Task, inputs={"clicks": {"on_error": "dead_letter", "dead_letter": "bad"}})
    driver.send_bad("clicks", raw="{not json", error="invalid JSON")
    driver.commit()
    assert driver.outputs("bad")[0][1]["raw"] == "{not json"
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from localstate.core.config import JobConfig, parse_job_config
from localstate.core.partitioner import partition_for
from localstate.runtime.partition.recovery import StoreRecovery
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.lifecycle import InProcessPartition
from localstate.runtime.partition.records import InputPolicy, OnError
from localstate.runtime.partition.sink import MemorySink
from localstate.core.stream import NO_BOUNDS, BadTimestamp, InputRecord, TimestampRule, timestamp_rule
from localstate.core.event_time import TIMESTAMP_OPTIONS
from localstate.core.routing import ON_MISROUTED, misrouted_record
from localstate.errors import ConfigError
from localstate.core.options import validate_options
from localstate.core.task import BatchTask, Envelope, StreamTask, merge_counts

__all__ = ["TaskTestDriver"]


class TaskTestDriver:
    """Drives every partition of a job in this process. Commits only when asked (or when the task's
    coordinator asks), unless ``commit_every`` is given. ``inputs`` declares inputs' bad-record
    policies, ``{stream: {"on_error": "fail" | "skip" | "dead_letter", "dead_letter": output}}``
    (undeclared inputs fail on a bad record, the default of ``[inputs.*]``)."""

    def __init__(self, task: type[StreamTask] | type[BatchTask] | Callable[[], StreamTask] | str, *,
                 stores: Mapping[str, Mapping[str, Any]] | None = None, partitions: int = 1,
                 state_dir: str | Path | None = None, changelog: str = "file",
                 changelog_options: Mapping[str, Any] | None = None, commit_every: int | None = None,
                 window_interval: float | None = None, allow_pickle: bool = False, job_name: str = "test-job",
                 job: JobConfig | None = None, inputs: Mapping[str, Mapping[str, str]] | None = None,
                 time: Mapping[str, Any] | None = None) -> None:
        self._tmp = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="localstate-test-")
            state_dir = self._tmp.name
        if job is None:
            job_table: dict[str, Any] = {"name": job_name, "partitions": partitions, "task": "unused:Unused",
                                         "changelog": changelog, "allow_pickle": allow_pickle,
                                         # Commits happen when the test asks, never on a timer.
                                         "commit_interval": 10 ** 9, "state_dir": str(state_dir)}
            if commit_every is not None:
                job_table["commit_every"] = commit_every
            if window_interval is not None:
                job_table["window_interval"] = window_interval
            job = parse_job_config({"job": job_table, "stores": dict(stores or {}),
                                    "changelogs": {changelog: dict(changelog_options or {})},
                                    "time": dict(time or {})}, base_dir=Path(state_dir))
        self.job = job
        self._task = task
        self.now = 0.0
        self.sink = MemorySink()
        self.inputs: dict[tuple[str, int], list[InputRecord]] = {}
        """every record sent, per (stream, partition): the replayable input log"""
        self.policies: dict[str, InputPolicy] = {}
        self.misrouted: dict[str, str] = {}
        """input -> its ``on_misrouted`` (:meth:`declare_input`; undeclared: fail)"""
        self.timestamps: dict[str, TimestampRule] = {}
        """input -> how its timestamps become event time (:meth:`declare_input`; undeclared: seconds, any
        finite number)"""
        for stream, options in (inputs or {}).items():
            self.declare_input(stream, **options)
        self.changelogs = open_changelog_system(job)
        self.instances: dict[int, TaskInstance] = {}
        self._counted: dict[str, dict[str, int]] = {}  # the committed counts of instances gone (crash, restart)
        self.recoveries: list[StoreRecovery] = []
        self._start()

    # -- lifecycle -----------------------------------------------------------------------------
    def _start(self) -> None:
        for partition in range(self.job.partitions):
            instance = TaskInstance(self.job, partition, self.changelogs, self.sink, self._task, clock=lambda: self.now,
                                    processing_clock=lambda: self.now)
            self.recoveries += instance.open()
            self.instances[partition] = instance

    def crash(self) -> None:
        """Lose everything not committed: stores close without flushing, buffered changelog records
        are dropped, the task object is discarded."""
        for instance in self.instances.values():
            merge_counts(self._counted, instance.counted)
            instance.abandon()
        self.instances.clear()
        self.changelogs.close()

    def restart(self) -> list[StoreRecovery]:
        """Start again from the last checkpoint and re-deliver every uncommitted input record."""
        if self.instances:
            self.crash()
        self.changelogs = open_changelog_system(self.job)
        self.recoveries = []
        self._start()
        replay: dict[int, list[tuple[str, InputRecord]]] = {}
        for (stream, partition), log in sorted(self.inputs.items()):
            position = self.instances[partition].position(stream)
            replay.setdefault(partition, []).extend((stream, record) for record in log[position:])
        for partition in self.instances:  # timers the replayed records (or the clock) made due fire too
            self._run(partition, replay.get(partition, []))
        return self.recoveries

    def close(self) -> None:
        """Commit and stop cleanly."""
        for instance in self.instances.values():
            instance.close(commit=True)
            merge_counts(self._counted, instance.counted)
        self.instances.clear()
        self.changelogs.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "TaskTestDriver":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.instances:
            self.close()
        elif self._tmp is not None:
            self._tmp.cleanup()

    # -- driving -------------------------------------------------------------------------------
    def declare_input(self, stream: str, on_error: str = "fail", dead_letter: str = "", timestamp_unit: str = "s",
                      min_timestamp: Any = False, max_timestamp: Any = False, on_misrouted: str = "fail") -> None:
        """Set input ``stream``'s bad-record policy, as ``[inputs.<stream>]`` would on a job:
        ``fail`` (an InputError), ``skip`` (logged), or ``dead_letter`` to output ``dead_letter``; and
        how the timestamps sent to it become event time (the options of the same names; here without
        bounds unless given: a test's timestamps are often small numbers). A timestamp that is no
        finite number inside them is a bad record under ``on_error``, as on a job. ``on_misrouted``: a
        record sent to a partition other than its key's (``partition=``) fails (the default), is
        skipped or dead-lettered, with ``route`` goes to its key's partition instead (the driver can
        route; ``localstate run`` cannot), with ``allow`` is processed where it was sent."""
        if on_misrouted not in ON_MISROUTED or (on_misrouted == "dead_letter" and not dead_letter):
            raise ConfigError.at(f"inputs.{stream}.on_misrouted", f"on_misrouted {on_misrouted!r}: use one of "
                                 f"{', '.join(ON_MISROUTED)} ('dead_letter' with a dead_letter output)")
        self.policies[stream] = OnError(stream, on_error, dead_letter)
        self.misrouted[stream] = on_misrouted
        self.timestamps[stream] = timestamp_rule(stream, validate_options(TIMESTAMP_OPTIONS, {
            "timestamp_unit": timestamp_unit, "min_timestamp": min_timestamp, "max_timestamp": max_timestamp},
            f"inputs.{stream}"))

    def _placed(self, stream: str, partition: int, record: InputRecord) -> tuple[int, InputRecord]:
        """Where ``record`` sent to ``partition`` goes, and as what: a record whose key belongs to
        another partition is routed there (``on_misrouted = "route"``) or made a bad record under the
        input's ``on_misrouted``, as a job's input reader makes it."""
        if record.error is not None or record.key is None or self.job.partitions == 1:
            return partition, record
        owner = partition_for(record.key, self.job.partitions)
        if owner == partition:
            return partition, record
        policy = self.misrouted.get(stream, "fail")
        if policy == "allow":
            return partition, record
        return (owner, record) if policy == "route" else (partition, misrouted_record(record, stream, owner, policy))

    def _record(self, stream: str, offset: int, key: Any, value: Any, ts: Any) -> InputRecord:
        """The record an input would yield for ``(key, value, ts)``: ``ts`` made event time by the
        input's rule, or a bad record when the rule refuses it."""
        try:
            return InputRecord(offset, key, value, self.timestamps.get(stream, NO_BOUNDS).seconds(ts))
        except BadTimestamp as exc:
            return InputRecord(offset, None, None, None, exc.problem, repr((key, value, ts))[:1000])

    def send(self, stream: str, key: Any, value: Any, *, partition: int | None = None,
             timestamp: float | None = None) -> Envelope:
        """Append a record to input ``stream`` (partitioned by key, like Kafka) and process it (a
        :class:`BatchTask` gets it as a one-row batch)."""
        if partition is None:
            partition = partition_for(key, self.job.partitions)
        ts = time.time() if timestamp is None else timestamp
        partition, record = self._placed(stream, partition, self._record(stream, 0, key, value, ts))
        record = self._append(stream, partition, record)
        return Envelope(stream, partition, record.offset, key, value, record.ts)

    def send_batch(self, stream: str, keys: Iterable[Any], values: Iterable[Any], *, partition: int | None = None,
                   timestamps: Iterable[float | None] | None = None) -> list[Envelope]:
        """Append records ``zip(keys, values)`` to input ``stream`` (each to its key's partition, or all
        to ``partition``) and feed each partition's records in one call: a :class:`BatchTask` gets
        them as one batch per partition (up to ``BATCH_ROWS`` rows), a StreamTask one by one."""
        keys, values = list(keys), list(values)
        now = time.time()
        times = [now] * len(keys) if timestamps is None else list(timestamps)
        if not len(keys) == len(values) == len(times):
            raise ValueError(f"send_batch: {len(keys)} keys, {len(values)} values, {len(times)} timestamps")
        grouped: dict[int, list[InputRecord]] = {}
        sent = []
        for key, value, ts in zip(keys, values, times):
            p = partition_for(key, self.job.partitions) if partition is None else partition
            p, record = self._placed(stream, p, self._record(stream, 0, key, value, ts))
            log = self.inputs.setdefault((stream, p), [])
            record = record._replace(offset=len(log))
            log.append(record)
            grouped.setdefault(p, []).append(record)
            sent.append(Envelope(stream, p, record.offset, key, value, record.ts))
        for p, records in grouped.items():
            self._run(p, [(stream, record) for record in records])
        return sent

    def send_rows(self, rows: Iterable[tuple[str, Any, Any, float | None]], *,
                  partition: int | None = None) -> list[Envelope]:
        """Append rows ``(stream, key, value, timestamp)`` of several inputs, in this order (each to
        its key's partition, or all to ``partition``) and feed each partition's rows in one call: a
        :class:`BatchTask` gets them as one batch per partition (up to ``BATCH_ROWS`` rows) whose
        ``stream`` column names each row's input, a StreamTask one by one. (``restart()`` re-delivers
        the uncommitted rows input by input.)"""
        grouped: dict[int, list[tuple[str, InputRecord]]] = {}
        sent = []
        for stream, key, value, ts in rows:
            p = partition_for(key, self.job.partitions) if partition is None else partition
            p, record = self._placed(stream, p, self._record(stream, 0, key, value, ts))
            log = self.inputs.setdefault((stream, p), [])
            record = record._replace(offset=len(log))
            log.append(record)
            grouped.setdefault(p, []).append((stream, record))
            sent.append(Envelope(stream, p, record.offset, key, value, record.ts))
        for p, pairs in grouped.items():
            self._run(p, pairs)
        return sent

    def send_bad(self, stream: str, raw: str, error: str = "could not decode the record", *, partition: int = 0,
                 timestamp: float | None = None) -> InputRecord:
        """Append a bad record (what an input yields for undecodable data) to ``stream`` and feed it:
        the input's ``on_error`` policy applies (see :meth:`declare_input`)."""
        return self._append(stream, partition, InputRecord(0, None, None, timestamp, error, raw))

    def feed(self, stream: str, records: Iterable[InputRecord], *, partition: int = 0) -> list[InputRecord]:
        """Append ``records`` (good ones and bad ones, ``error`` set) to ``stream``'s partition, in
        order, and feed them; their offsets are the log's (the given ones are ignored). A StreamTask
        gets them one by one, a BatchTask in one batch (up to ``BATCH_ROWS`` rows)."""
        if not isinstance(self.instances[partition].task, BatchTask):
            return [self._append(stream, partition, record) for record in records]
        log = self.inputs.setdefault((stream, partition), [])
        appended = []
        for record in records:
            placed, record = self._placed(stream, partition, record)
            if placed != partition:  # routed: fed to its own partition, one by one
                self._append(stream, placed, record)
                continue
            record = record._replace(offset=len(log))
            log.append(record)
            appended.append(record)
        self._run(partition, [(stream, record) for record in appended])
        return appended

    def _append(self, stream: str, partition: int, record: InputRecord) -> InputRecord:
        partition, record = self._placed(stream, partition, record)
        log = self.inputs.setdefault((stream, partition), [])
        record = record._replace(offset=len(log))
        log.append(record)
        self._run(partition, [(stream, record)])
        return record

    def _run(self, partition: int, records: list[tuple[str, InputRecord]]) -> None:
        """``records`` through the partition's lifecycle, as the job runs them (the store time
        refreshed, the records fed with commits as configured, the due timers fired, ``window()``
        when due); no records: a tick of the clock."""
        InProcessPartition(self.instances[partition], records, self.policies).run()

    def commit(self, partition: int | None = None) -> None:
        for p, instance in self.instances.items():
            if partition is None or p == partition:
                instance.commit()

    def advance(self, seconds: float) -> None:
        """Move the driver's clock forward, run windows that became due and fire the processing-time
        timers that became due (their outputs commit with the next commit)."""
        if seconds < 0:
            raise ValueError(f"the driver's clock moves forward only, got {seconds!r} seconds")
        self.now += seconds
        for partition in self.instances:
            self._run(partition, [])

    def advance_processing_time(self, seconds: float) -> None:
        """:meth:`advance`: processing time is the driver's clock (:attr:`now`, from 0.0), which moves
        only when the test moves it."""
        self.advance(seconds)

    def advance_event_time(self, to: float, partition: int | None = None) -> None:
        """Move the watermark of every partition (or of ``partition``) to ``to``, as if records up to
        ``to`` plus the allowed lateness had been seen, and fire the event-time timers that became
        due. A watermark never goes back: a ``to`` behind it changes nothing."""
        for p, instance in self.instances.items():
            if partition is None or p == partition:
                instance.time.advance_watermark(to)
                self._run(p, [])

    def watermark(self, partition: int = 0) -> float | None:
        """The watermark of ``partition`` (None before any timestamped record)."""
        return self.instances[partition].time.watermark

    def window(self, partition: int | None = None) -> None:
        for p, instance in self.instances.items():
            if partition is None or p == partition:
                instance.window()

    # -- inspecting ----------------------------------------------------------------------------
    def counts(self) -> dict[str, dict[str, int]]:
        """What the committed work dropped or redirected, as a job reports it per batch
        (:class:`~localstate.core.task.TaskCounters`: ``late_records`` per window store), summed over
        the partitions and every commit since the driver started, crashes and restarts included
        (what a crash rolled back is counted again when it is re-delivered and committed)."""
        out: dict[str, dict[str, int]] = {}
        merge_counts(out, self._counted)
        for instance in self.instances.values():
            merge_counts(out, instance.counted)
        return out

    def store(self, name: str, partition: int = 0) -> Any:
        return self.instances[partition].stores[name].engine

    def outputs(self, stream: str, *, pending: bool = False) -> list[tuple[Any, Any]]:
        """Committed outputs of ``stream`` (plus not yet committed ones with ``pending=True``)."""
        messages = self.sink.messages(stream)
        if pending:
            for instance in self.instances.values():
                messages += [m for m in instance.collector.pending if m.stream == stream]
        return [(m.key, m.value) for m in messages]
