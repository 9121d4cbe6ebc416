"""An in-memory changelog system for unit tests and benchmarks. Not durable: it lives only as long
as the process. Partitions of one system instance are shared, so a test can close a store and
restore it from the same changelog."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any, Iterator, Mapping

from localstate.core.changelog import ChangelogPartition, ChangelogRecord, ChangelogSystem

__all__ = ["MemoryChangelogPartition", "MemoryChangelogSystem"]


class MemoryChangelogPartition(ChangelogPartition):
    """A list of records; ``flush()`` publishes appended records to readers."""

    def __init__(self, stream: str = "memory", partition: int = 0) -> None:
        self.stream = stream
        self.partition = partition
        self.records: list[ChangelogRecord] = []
        self._offsets: list[int] = []
        self._pending: list[tuple[bytes, bytes | None]] = []
        self._next = 0
        self.flushes = 0

    def append(self, key: bytes, value: bytes | None) -> None:
        self._pending.append((key, value))

    def append_many(self, records) -> None:  # noqa: ANN001 - see ChangelogWriter
        self._pending.extend(records)

    def flush(self) -> int:
        for key, value in self._pending:
            self.records.append(ChangelogRecord(bytes(key), None if value is None else bytes(value), self._next))
            self._offsets.append(self._next)
            self._next += 1
        self._pending.clear()
        self.flushes += 1
        return self._next

    def end_offset(self) -> int:
        return self._next + len(self._pending)

    def read(self, start: int = 0, end: int | None = None) -> Iterator[ChangelogRecord]:
        stop = self._next if end is None else min(end, self._next)
        index = bisect.bisect_left(self._offsets, start)
        while index < len(self.records) and self.records[index].offset < stop:
            yield self.records[index]
            index += 1

    def drop_unflushed(self) -> None:
        """Simulate a crash of the writer: appended records that were not flushed are lost."""
        self._pending.clear()


class MemoryChangelogSystem(ChangelogSystem):
    """Changelog system whose partitions live in this object (``changelog = "memory"``)."""

    description = "in-memory changelog for tests and benchmarks (not durable)"

    def __init__(self, options: Mapping[str, Any] | None = None, state_dir: Path | None = None) -> None:
        super().__init__(options or {}, state_dir or Path("."))
        self._partitions: dict[tuple[str, int], MemoryChangelogPartition] = {}

    def partition(self, stream: str, partition: int) -> MemoryChangelogPartition:
        key = (stream, partition)
        if key not in self._partitions:
            self._partitions[key] = MemoryChangelogPartition(stream, partition)
        return self._partitions[key]
