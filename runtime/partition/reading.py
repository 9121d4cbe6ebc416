"""Reading a partition's inputs from the instance's positions: the one reader that a micro-batch
(up to its planned ends) and a continuous run (up to what the inputs hold now) both use.

Several inputs are merged by ``(ts, input, offset)``: a merge that is resumable at any cut, so the
processing order does not depend on where batches or commits fall. Each input's co-partitioning is
checked as it is read (:class:`~localstate.core.routing.RoutingCheck`)."""

from __future__ import annotations

import heapq
from itertools import islice, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol

from localstate.core.routing import RoutingCheck
from localstate.core.stream import ColumnarInput, InputRecord, InputStream
from localstate.core.task import BatchTask
from localstate.runtime.partition.records import ColumnRows

if TYPE_CHECKING:
    from localstate.core.task import StreamTask

__all__ = ["read_inputs"]


class _Positioned(Protocol):
    """What the reader asks of a task instance: its positions (and its task, for the columnar path)."""

    task: "StreamTask | None"

    def position(self, stream: str) -> int: ...


def _sort_key(ts: float | None, index: int, offset: int) -> tuple[float, int, int]:
    return (float("-inf") if ts is None else ts, index, offset)


def _keyed(records: Iterator[InputRecord], index: int, name: str) -> Iterator[tuple[Any, str, InputRecord]]:
    for record in records:
        yield _sort_key(record.ts, index, record.offset), name, record


def _routed(source: InputStream, partition: int, records: Iterator[InputRecord]) -> Iterator[InputRecord]:
    """``records`` of ``source``'s ``partition`` with co-partitioning checked (:class:`RoutingCheck`):
    a record whose key belongs to another partition becomes a bad record under ``on_misrouted``."""
    check = RoutingCheck.of(source, partition)
    return records if check is None else check.records(records)


def read_inputs(instance: _Positioned, partition: int, ends: Mapping[str, int], inputs: Mapping[str, InputStream],
                limit: int | None = None) -> Iterator[tuple[str, InputRecord]]:
    """Records of each input in ``ends`` from the instance's position up to that end, as ``(input,
    record)`` in processing order; at most ``limit`` records (all inputs together). A batch task
    reading one :class:`~localstate.core.stream.ColumnarInput` with no limit gets
    :class:`~localstate.runtime.partition.records.ColumnRows` chunks instead (the same rows)."""
    names = sorted(ends)
    if len(names) == 1 and limit is None and isinstance(getattr(instance, "task", None), BatchTask) \
            and isinstance(inputs[names[0]], ColumnarInput):
        # A batch task reading one input that decodes to columns: chunks, no record tuple per row.
        name = names[0]
        chunks = inputs[name].read_columns(partition, instance.position(name), ends[name])  # type: ignore[attr-defined]
        check = RoutingCheck.of(inputs[name], partition)
        chunks = chunks if check is None else check.columns(chunks)
        return (ColumnRows(name, columns) for columns in chunks)  # type: ignore[misc]
    streams = [_routed(inputs[name], partition, inputs[name].read(partition, instance.position(name), ends[name]))
               for name in names]
    if len(streams) == 1:  # the common case needs no merge (and no sort key per record)
        items: Iterator[tuple[str, InputRecord]] = zip(repeat(names[0]), streams[0])
    else:
        merged = heapq.merge(*(_keyed(s, i, n) for i, (n, s) in enumerate(zip(names, streams))), key=itemgetter(0))
        items = ((name, record) for _, name, record in merged)
    if limit is not None:
        items = islice(items, limit)
    return items
