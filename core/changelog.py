"""The changelog contract: what an engine logs to, and what a changelog system provides.

An engine only ever sees a :class:`ChangelogWriter`. The runtime sees whole
:class:`ChangelogPartition` objects (read, end offset) obtained from a :class:`ChangelogSystem`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Mapping

from localstate.core.options import Option, validate_options

__all__ = [
    "ChangelogRecord",
    "ChangelogWriter",
    "ChangelogPartition",
    "ChangelogSystem",
    "NullChangelogWriter",
    "PLUGIN_API_VERSION",
]

#: Version of the plugin API that engines, changelog systems and serdes declare as ``plugin_api``.
PLUGIN_API_VERSION = 1


@dataclass(frozen=True, slots=True)
class ChangelogRecord:
    """One changelog record. ``value is None`` is a tombstone (the key was deleted)."""

    key: bytes
    value: bytes | None
    offset: int


class ChangelogWriter(ABC):
    """Where an engine logs its changes: ``(key, value | None)`` records, buffered until :meth:`flush`.

    Guarantee every implementation gives: after ``flush()`` returns ``n``, every appended record is
    durable and the partition's next record will get offset ``n``.
    """

    @abstractmethod
    def append(self, key: bytes, value: bytes | None) -> None:
        """Buffer one record."""

    def append_many(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Buffer many records in order. Implementations may override to batch."""
        for key, value in records:
            self.append(key, value)

    @abstractmethod
    def flush(self) -> int:
        """Make every appended record durable and return the end offset (the next offset)."""


class NullChangelogWriter(ChangelogWriter):
    """Writer for stores configured with ``changelog = false``: records go nowhere.

    Such a store is not fault tolerant; its local offset stays 0 and it is never restored.
    """

    def append(self, key: bytes, value: bytes | None) -> None:
        pass

    def append_many(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        pass

    def flush(self) -> int:
        return 0


class ChangelogPartition(ChangelogWriter):
    """One partition of one changelog stream: append, flush, read any offset range."""

    stream: str
    partition: int

    @abstractmethod
    def end_offset(self) -> int:
        """The offset the next appended record will get, counting appended-but-unflushed records."""

    @abstractmethod
    def read(self, start: int = 0, end: int | None = None) -> Iterator[ChangelogRecord]:
        """Yield records with ``start <= offset < end`` (``end=None``: up to the flushed end), in
        offset order. Offsets may have gaps (compaction)."""

    def read_batches(self, start: int = 0, end: int | None = None) -> Iterator[list[ChangelogRecord]]:
        """The records of :meth:`read`, in lists (each list is new and belongs to the caller).

        A bulk path for consumers that work in batches; implementations may override it to decode
        many records at once. This default groups :meth:`read` in lists of up to 4096 records."""
        batch: list[ChangelogRecord] = []
        for record in self.read(start, end):
            batch.append(record)
            if len(batch) >= 4096:
                yield batch
                batch = []
        if batch:
            yield batch

    def close(self) -> None:
        """Release resources. Unflushed records may be lost."""


class ChangelogSystem(ABC):
    """A changelog system (file, kafka, ...): a factory of changelog partitions.

    Subclasses are plugins registered under the ``localstate.changelogs`` entry-point group.
    They declare their options in ``options``; :meth:`validate` checks a raw option table.
    """

    plugin_api: ClassVar[int] = PLUGIN_API_VERSION
    options: ClassVar[Mapping[str, Option]] = {}
    description: ClassVar[str] = ""

    def __init__(self, options: Mapping[str, Any], state_dir: Path) -> None:
        self.config = dict(options)
        self.state_dir = Path(state_dir)

    @classmethod
    def validate(cls, raw: Mapping[str, Any], path: str) -> dict[str, Any]:
        """Check ``raw`` against ``options``; problems are reported under ``path``."""
        return validate_options(cls.options, raw, path)

    def ensure_stream(self, stream: str, partitions: int) -> None:
        """Create ``stream`` with ``partitions`` partitions if missing, or check it if present."""

    @abstractmethod
    def partition(self, stream: str, partition: int) -> ChangelogPartition:
        """Open one partition of a stream for appending and reading."""

    def close(self) -> None:
        """Release shared resources (connections, producers)."""
