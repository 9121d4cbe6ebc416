"""The one feed loop of a task partition: input records (and batches) to the user's task, in order.

Every runner goes through :meth:`Feeder.feed`: the Spark executors (a batch's input ranges, no
commit inside a batch), the TaskTestDriver and a continuous run (records as they come, committing
between them as the commit policy says). Per ``(input stream, record)`` pair it

1. reaches the ``process`` crash point;
2. calls ``task.process()`` (a failure becomes a TaskError naming the user's frame), or, for a bad
   record, applies the input's ``on_error`` policy (:mod:`.records`);
3. advances the input's position past the record (what the next checkpoint stores);
4. calls ``between`` when given, which may commit, and stops the feed when it returns True: after
   each record, or, with ``check_every``, once the records it allows have passed, right after a
   record whose ``process()`` asked for a commit or a shutdown, and at the feed's end.

A :class:`~localstate.core.task.BatchTask` gets the same records as Arrow batches: up to
:data:`~.records.BATCH_ROWS` records at a time become one batch (bad records get their input's
``on_error`` and are left out of it); :class:`~.records.ArrowRows` (rows held as Arrow already: the
DataFrame step) and :class:`~.records.ColumnRows` (inputs read as columns) are delivered as they are.
Positions move past whole batches, and ``between`` runs after each batch, so a commit never splits
one. A StreamTask given ArrowRows gets their rows one by one.

The loop is the runtime's hot path: envelopes built by :func:`~.records.make_envelope`, records
pulled in chunks (reading is timed per chunk), and no per-record call unless ``between`` asks for one.
"""

from __future__ import annotations

import time
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from localstate.core.task import BatchTask, Collector, Coordinator, StreamTask, TaskCounters, record_batch
from localstate.core.tracebacks import raise_task_error
from localstate.runtime.partition.faults import crash_point, crash_points
from localstate.runtime.partition.records import BATCH_ROWS, CHUNK, PROCESS_HINT, ArrowRows, ColumnRows, FeedStats, \
    InputPolicy, apply_on_error, make_envelope
from localstate.runtime.partition.timers import PartitionTime

if TYPE_CHECKING:
    from localstate.core.stream import InputRecord
    from localstate.runtime.partition.accounting import CommitAccounting

__all__ = ["Feeder", "Between"]

Between = Callable[[int], bool]
"""Called after each record (or batch) with how many it covered; True stops the feed."""

CheckEvery = Callable[[], int]
"""How many records (at least 1) may pass before ``between`` is called again (a request by the task
aside): asked after each call of ``between``."""


class Feeder:
    """Feeds one task partition's task. ``positions`` is the partition's input positions (shared with
    its instance, which checkpoints them); ``time`` sees every event timestamp fed."""

    def __init__(self, task: StreamTask, partition: int, collector: Collector, coordinator: Coordinator,
                 counters: TaskCounters, positions: dict[str, int], time: PartitionTime, several_inputs: bool,
                 accounting: "CommitAccounting | None" = None) -> None:
        self.task = task
        self.partition = partition
        self.collector = collector
        self.counters = counters
        """where records dropped or redirected are counted (``context.counters``)"""
        self.coordinator = coordinator
        self.positions = positions
        self.time = time
        self.several_inputs = several_inputs
        """a batch carries a ``stream`` column only when the job has several inputs"""
        self.accounting = accounting
        """told when the first record since the last commit was read (:attr:`CommitAccounting.oldest`)"""

    def feed(self, records: Iterable[tuple[str, "InputRecord"]], policies: Mapping[str, InputPolicy] | None = None,
             between: Between | None = None, check_every: CheckEvery | None = None) -> FeedStats:
        """Feed ``(input stream, record)`` pairs in processing order (see the module docstring);
        ``policies``: each input's bad-record policy (none: fail with an InputError)."""
        if isinstance(self.task, BatchTask):
            return self._feed_batches(records, policies or {}, between)
        stats = FeedStats()
        policies = policies or {}
        partition, collector, coordinator, positions = self.partition, self.collector, self.coordinator, self.positions
        process = self.task.process
        envelope, point = make_envelope, crash_point
        partition_time = self.time
        n = 0
        pending = 0  # records fed since the last call of between
        stride = check_every() if between is not None and check_every is not None else 1
        accounting = self.accounting
        try:
            for chunk in _timed_chunks(records, CHUNK, stats, accounting):
                if chunk[0].__class__ is ArrowRows:  # rows held as Arrow (the DataFrame step)
                    chunk = [pair for rows in chunk for pair in rows.records()]
                chunk_end = n + len(chunk)
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
                        apply_on_error(policies.get(name), partition, collector, self.counters, name, record, stats)
                    positions[name] = record.offset + 1
                    if between is not None:
                        pending += 1
                        if pending >= stride or coordinator.commit_requested or coordinator.shutdown_requested:
                            covered, pending = pending, 0
                            if between(covered):
                                return stats
                            if check_every is not None:
                                stride = check_every()
                            if accounting is not None and accounting.oldest is None and n < chunk_end:
                                accounting.oldest = stats.chunk_read  # a commit came inside the chunk
            if pending:
                between(pending)  # type: ignore[misc]  # the feed ends here anyway
        finally:
            stats.records = n
        return stats

    def _feed_batches(self, records: Iterable[Any], policies: Mapping[str, InputPolicy],
                      between: Between | None) -> FeedStats:
        """:meth:`feed` for a BatchTask: each chunk of the input becomes one delivered batch."""
        stats = FeedStats()
        n = 0
        accounting = self.accounting
        try:
            for chunk in _timed_chunks(records, BATCH_ROWS, stats, accounting):
                kind = chunk[0].__class__
                if kind is ColumnRows or kind is ArrowRows:
                    for rows in chunk:
                        count = self._feed_columns(rows, policies, stats) if kind is ColumnRows \
                            else self._feed_arrow(rows)
                        n += count
                        if between is not None and between(count):
                            return stats
                        if accounting is not None and accounting.oldest is None and rows is not chunk[-1]:
                            accounting.oldest = stats.chunk_read  # a commit came inside the chunk
                    continue
                self._feed_records(chunk, policies, stats)
                n += len(chunk)
                if between is not None and between(len(chunk)):
                    return stats
        finally:
            stats.records = n
        return stats

    def _feed_records(self, chunk: list[tuple[str, "InputRecord"]], policies: Mapping[str, InputPolicy],
                      stats: FeedStats) -> None:
        """One chunk of records as one batch: ``on_error`` per bad record (in order), the good ones
        delivered together; the positions move past the chunk."""
        crash_points("process", len(chunk))  # reached once per record, good or bad, as per record
        names, chosen = zip(*chunk)
        offsets, keys, values, times, errors, _raws = zip(*chosen)
        if errors.count(None) != len(errors):  # bad records: on_error per row, left out of the batch
            good = []
            for name, record in chunk:
                if record.error is None:
                    good.append((name, record))
                else:
                    apply_on_error(policies.get(name), self.partition, self.collector, self.counters, name, record, stats)
            if good:
                good_names, good_records = zip(*good)
                g_offsets, keys, values, times, _e, _r = zip(*good_records)
            else:
                good_names, g_offsets = (), ()
        else:
            good_names, g_offsets = names, offsets
        if g_offsets:
            batch = record_batch(list(good_names), list(g_offsets), list(keys), list(values), list(times),
                                 with_stream=self.several_inputs)
            self._deliver(batch, good_names[0], g_offsets[0], len(g_offsets))
            high = max((ts for ts in times if ts is not None), default=None)
            self.time.observe(high)  # after the batch: process_batch() saw the watermark before it
        positions = self.positions
        if len(set(names)) == 1:
            positions[names[0]] = offsets[-1] + 1
        else:
            for name, offset in zip(names, offsets):
                positions[name] = offset + 1

    def _feed_columns(self, rows: ColumnRows, policies: Mapping[str, InputPolicy], stats: FeedStats) -> int:
        """One chunk of an input read as columns: the ``process`` crash point per row, ``on_error``
        per bad row (in offset order), one batch of the good rows; the position moves past the chunk.
        Returns the rows fed."""
        name, columns = rows.stream, rows.columns
        count = columns.rows
        crash_points("process", count)
        for record in columns.bad:
            apply_on_error(policies.get(name), self.partition, self.collector, self.counters, name, record, stats)
        if columns.offsets:
            batch = record_batch([name], columns.offsets, columns.keys, columns.values, columns.timestamps,
                                 with_stream=self.several_inputs)
            self._deliver(batch, name, columns.offsets[0], len(columns.offsets))
            self._observe_column(batch)  # after the batch: process_batch() saw the watermark before it
        self.positions[name] = columns.end
        return count

    def _feed_arrow(self, rows: ArrowRows) -> int:
        """Rows held as Arrow already, delivered as they are. Returns the rows fed."""
        count = rows.batch.num_rows
        crash_points("process", count)
        if count:
            self._deliver(rows.batch, rows.stream, rows.start, count)
            self._observe_column(rows.batch)
            self.positions[rows.stream] = rows.start + count
        return count

    def _observe_column(self, batch: Any) -> None:
        """The watermark sees the largest event timestamp of an Arrow batch's ``timestamp`` column."""
        import pyarrow.compute as pc  # about a second to import; batch tasks only, which loaded it already

        if "timestamp" in batch.schema.names:
            self.time.observe(pc.max(batch.column("timestamp")).as_py())

    def _deliver(self, batch: Any, stream: str, offset: int, rows: int) -> None:
        """``process_batch()`` of one batch (``rows`` rows, the first at ``stream``/``offset``); a
        failure becomes a TaskError naming the user's frame and the batch's first row."""
        try:
            self.task.process_batch(batch, self.collector, self.coordinator)  # type: ignore[attr-defined]
        except (Exception, SystemExit) as exc:
            raise_task_error(exc, "process_batch()", stream=stream, partition=self.partition, offset=offset,
                             rows=rows, hint=PROCESS_HINT)


def _timed_chunks(records: Iterable[Any], size: int, stats: FeedStats,
                  accounting: "CommitAccounting | None" = None) -> Iterator[list[Any]]:
    """``records`` in lists of up to ``size``, the time spent pulling them (reading and decoding the
    input) added to ``stats.read_seconds``: reading and processing are timed apart for free. When
    each pull started is ``stats.chunk_read``, and the ``accounting``'s oldest read when it had none."""
    items, clock = iter(records), time.perf_counter
    while True:
        started = clock()
        chunk = list(islice(items, size))
        stats.read_seconds += clock() - started
        if not chunk:
            return
        stats.chunk_read = started
        if accounting is not None and accounting.oldest is None:
            accounting.oldest = started
        yield chunk
