"""The changelog contract: what an engine logs to, and what a changelog system provides.

An engine only ever sees a :class:`ChangelogWriter`. The runtime sees whole
:class:`ChangelogPartition` objects (read, end offset) obtained from a :class:`ChangelogSystem`.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Protocol, runtime_checkable

from localstate.native import load as load_native
from localstate.core.options import Option, validate_options

__all__ = [
    "EpochCheckpoints",
    "ChangelogRecord",
    "RecordColumns",
    "split_spans",
    "ChangelogWriter",
    "ChangelogPartition",
    "ChangelogSystem",
    "NullChangelogWriter",
    "PLUGIN_API_VERSION",
    "CompactionStats",
    "StreamLocations",
    "LocalStreams",
    "ReadOnlyPartitions",
    "DeletableStreams",
    "Compactable",
    "CompactionRounds",
    "ManifestedChangelog",
    "InFlightManifest",
    "DeferredDurability",
    "StoredHistory",
    "ListedHistory",
    "DurableCheckpoints",
    "ManifestedStreams",
]

#: Version of the plugin API that engines, changelog systems and serdes declare as ``plugin_api``.
PLUGIN_API_VERSION = 1


@dataclass(frozen=True, slots=True)
class ChangelogRecord:
    """One changelog record. ``value is None`` is a tombstone (the key was deleted)."""

    key: bytes
    value: bytes | None
    offset: int


class RecordColumns:
    """A run of consecutive changelog records in columns: record ``i`` is ``keys[i]`` ->
    ``values[i]`` (None: tombstone), in offset order; ``end`` is the offset after the last one
    (offsets inside may have gaps after compaction). ``nbytes``: the bytes the run took on disk
    (for progress reports). The bulk restore path: no object per record.

    A run may also be *framed* (:meth:`from_frames`): its records still in the bytes they were read
    from, as :attr:`framed` ``(buffer, spans)`` (four native int64 per record: key start, key length,
    value start, value length or -1 for a tombstone). Its ``keys`` and ``values`` are then made on
    first use; a restore that sorts reads :attr:`framed` instead (``backend.coalesce_sorted``) and
    makes objects only for the records it keeps, in key order."""

    __slots__ = ("_keys", "_values", "end", "nbytes", "framed", "_count")

    def __init__(self, keys: list[bytes], values: list[bytes | None], end: int, nbytes: int = 0) -> None:
        self._keys: list[bytes] | None = keys
        self._values: list[bytes | None] | None = values
        self.end = end
        self.nbytes = nbytes
        self.framed: tuple[bytes, bytes] | None = None
        self._count = len(keys)

    @classmethod
    def from_frames(cls, buffer: bytes, spans: bytes, count: int, end: int, nbytes: int = 0) -> "RecordColumns":
        """A framed run of ``count`` records (see the class docstring); the buffer is kept alive by it."""
        run = cls.__new__(cls)
        run._keys = run._values = None
        run.end, run.nbytes, run.framed, run._count = end, nbytes, (buffer, spans), count
        return run

    @property
    def keys(self) -> list[bytes]:
        if self._keys is None:
            self._split()
        return self._keys  # type: ignore[return-value]

    @property
    def values(self) -> list[bytes | None]:
        if self._values is None:
            self._split()
        return self._values  # type: ignore[return-value]

    def _split(self) -> None:
        """Make the columns of a framed run (once; the buffer is let go)."""
        assert self.framed is not None
        self._keys, self._values = split_spans(*self.framed)
        self.framed = None

    def __len__(self) -> int:
        return self._count if self._keys is None else len(self._keys)

    def __eq__(self, other: object) -> bool:
        """Runs are equal when their records, end and size are, framed or not."""
        if not isinstance(other, RecordColumns):
            return NotImplemented
        return (self.keys, self.values, self.end, self.nbytes) == (other.keys, other.values, other.end, other.nbytes)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it was

    def __repr__(self) -> str:
        return f"RecordColumns({len(self)} records, end={self.end}, nbytes={self.nbytes}" \
               f"{', framed' if self.framed is not None else ''})"


_SPAN = struct.Struct("=qqqq")
_SORTING = load_native("localstate.native._sorting")


def split_spans(buffer: bytes, spans: bytes) -> tuple[list[bytes], list[bytes | None]]:
    """A framed run (see :class:`RecordColumns`) as its key and value columns: in C when the
    ``localstate.native._sorting`` extension is built, else in Python (the same result)."""
    if _SORTING is not None:
        return _SORTING.split_spans(buffer, spans)
    return py_split_spans(buffer, spans)


def py_split_spans(buffer: bytes, spans: bytes) -> tuple[list[bytes], list[bytes | None]]:
    """:func:`split_spans` in Python: the reference the C version is tested against."""
    keys: list[bytes] = []
    values: list[bytes | None] = []
    for key, klen, value, vlen in _SPAN.iter_unpack(spans):
        keys.append(buffer[key:key + klen])
        values.append(buffer[value:value + vlen] if vlen >= 0 else None)
    return keys, values


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

    def read_columns(self, start: int = 0, end: int | None = None) -> Iterator[RecordColumns]:
        """The records of :meth:`read` as :class:`RecordColumns` runs (each new, owned by the caller).

        The restore path of engines that take columns (``core.engine.ColumnRestore``); systems may
        override it to decode straight into columns. This default converts :meth:`read_batches`."""
        for batch in self.read_batches(start, end):
            if batch:
                yield RecordColumns([r.key for r in batch], [r.value for r in batch], batch[-1].offset + 1,
                                    sum(len(r.key) + len(r.value or b"") for r in batch))

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


@dataclass
class CompactionStats:
    """What one compaction did. ``records_*``/``bytes_*`` count the whole partition (every segment,
    the active one included) before and after; ``horizon`` is the partition's tombstone horizon after."""

    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    tombstones_dropped: int = 0
    """a key's last record, a delete, dropped too: appended longer ago than the tombstone retention"""
    segments_rewritten: int = 0
    """segments replaced by a copy without their superseded records"""
    segments_deleted: int = 0
    """segments removed whole: every record in them superseded or dropped"""
    seconds: float = 0.0
    partitions: dict[int, "CompactionStats"] = field(default_factory=dict)
    """a stream's compaction: each partition's own figures"""
    horizon: int = 0

    TOTALS: ClassVar[tuple[str, ...]] = ("records_before", "records_after", "bytes_before", "bytes_after",
                                         "tombstones_dropped", "segments_rewritten", "segments_deleted", "seconds")
    """the figures that add up over partitions (:meth:`add`)"""

    def add(self, other: "CompactionStats") -> None:
        for name in self.TOTALS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Optional capabilities of a changelog system. The core asks for them with isinstance (the
# Protocols are runtime_checkable) and never names a system: a system offers what it can do.

@runtime_checkable
class StreamLocations(Protocol):
    """A system whose streams live in a known place, so an output can be kept from writing into one."""

    def stream_location(self, stream: str) -> tuple[str, str]:
        """Where ``stream`` lives: ``("path", <absolute directory>)`` or ``("kafka", <topic>)``, in the
        form of ``InputStream.location``."""


@runtime_checkable
class LocalStreams(Protocol):
    """A system keeping each stream in a local directory (created with the ``changelog-stream``
    ownership marker): ``localstate reset`` deletes such directories itself, never through a
    symlink, and ``localstate inspect`` reads them without a lock, next to a live writer."""

    root: Path
    """The directory holding every stream of the system."""

    def stream_dir(self, stream: str) -> Path:
        """The stream's directory (raises UnsafePathError if it is a symlink or leaves its root)."""

    def partition_dir(self, stream: str, partition: int) -> Path:
        """One partition's directory (same checks)."""

    def reader(self, stream: str, partition: int) -> ChangelogPartition:
        """A read-only partition, opened without the writer lock."""

    def segments(self, stream: str, partition: int) -> list[tuple[str, int]]:
        """``(file name, bytes)`` of the partition's files, oldest first."""

    def close(self) -> None:
        """Release shared resources."""


@runtime_checkable
class ReadOnlyPartitions(Protocol):
    """A system that opens a partition for reading only: no writer lock or producer taken, nothing
    created, truncated or fenced (``localstate inspect``, the Spark state reader)."""

    def reader(self, stream: str, partition: int) -> ChangelogPartition:
        """A read-only partition (its ``append``/``flush`` are refused)."""


@runtime_checkable
class DeletableStreams(Protocol):
    """A system that can delete a remote stream and every record in it (``localstate reset``)."""

    def delete_stream(self, stream: str) -> bool:
        """Delete ``stream``; False if it did not exist."""


@runtime_checkable
class CompactionRounds(Protocol):
    """One compaction round over a set of partitions, run on demand (see :class:`Compactable`)."""

    runs: int

    def run_once(self) -> CompactionStats:
        """Compact every target once; errors are logged and remembered, never raised."""


@runtime_checkable
class Compactable(Protocol):
    """A system that compacts its streams on demand (last record per key below an offset). Systems
    that compact on their own (Kafka's log cleaner) do not offer it.

    Guarantee: only records below ``upto`` are rewritten, so a trim after a crash still finds the
    values it needs."""

    compact_interval: float
    """Seconds between background compaction rounds while a job runs (0: none)."""

    def compact_stream(self, stream: str, upto_by_partition: Mapping[int, int]) -> CompactionStats:
        """Compact every listed partition below its ``upto`` offset; the totals."""

    def compaction_rounds(self, targets: Callable[[], Mapping[tuple[str, int], int]]) -> CompactionRounds:
        """Rounds over ``targets()`` (``{(stream, partition): upto}``), run by the caller."""


@runtime_checkable
class ManifestedChangelog(Protocol):
    """A partition whose committed content is named by the checkpoint, not by what its storage holds
    (immutable objects on shared storage, Delta/Spark-changelog-checkpointing style).

    The runtime calls :meth:`adopt` with the manifest of the task partition's checkpoint (None: no
    checkpoint yet) right after opening the partition, before any read or append, and records
    :meth:`manifest` in every checkpoint it prepares. Whatever else the storage holds (a crashed or
    zombie attempt's objects) is invisible by construction: nothing is ever listed to decide it."""

    def manifest(self) -> dict[str, Any]:
        """A JSON-able description of the partition's chain up to :meth:`ChangelogPartition.end_offset`
        (every record flushed): the objects a restore reads, and nothing else. Every object it names
        is durably written when it returns (a partition may write what ``flush`` sealed in the
        background, and waits for it here); a failed write raises ChangelogError."""

    def adopt(self, manifest: dict[str, Any] | None) -> None:
        """Make the chain ``manifest`` names (None: empty) this partition's content; records appended
        before are discarded. Raises ChangelogError if the manifest is malformed."""


@dataclass(frozen=True)
class InFlightManifest:
    """A manifest taken without waiting for the writes it names (see :class:`DeferredDurability`).
    ``durable()`` blocks until every object ``manifest`` names is durably written and raises
    ChangelogError (naming stream, partition and object) if one could not be; it may be called from
    any thread, any number of times."""

    manifest: dict[str, Any]
    durable: Callable[[], None]


@runtime_checkable
class DeferredDurability(Protocol):
    """A :class:`ManifestedChangelog` whose ``flush`` only *starts* writing what it sealed (the
    objectstore's delta PUT runs in the background): ``manifest()`` waits for it, and this capability
    lets a caller take the manifest without waiting, so that a commit need not wait for its own PUT
    (the pipelined commit of :class:`~localstate.runtime.partition.instance.TaskInstance`). Changelogs whose flush
    is durable when it returns (file, Kafka, memory) do not offer it.

    Guarantee: a checkpoint naming ``in_flight_manifest().manifest`` may be saved once ``durable()``
    returned; a failed write also fails every later flush and manifest until :meth:`adopt` (the chain
    would have a gap), so nothing after the last saved checkpoint can be committed."""

    def in_flight_manifest(self) -> InFlightManifest:
        """The manifest of the chain up to the flushed end (as :meth:`ManifestedChangelog.manifest`),
        without waiting for the write in flight; raises ChangelogError at once if a write already
        failed or records are unflushed."""

    def settle(self) -> None:
        """Wait for the write in flight, if any (every flushed record is then durable); raises the
        ChangelogError of a failed write."""


@dataclass(frozen=True)
class StoredHistory:
    """What one listing of a changelog partition's storage found: ``objects`` holding records of
    ``stream`` (``size`` bytes, reaching up to offset ``end``), below ``where`` (a URL or path prefix,
    for messages)."""

    stream: str
    objects: int
    size: int
    end: int
    where: str


@runtime_checkable
class ListedHistory(Protocol):
    """A :class:`ManifestedChangelog` whose storage can be listed for the partition's records.

    Its ``end_offset()`` is what the adopted manifest says, so it cannot show, as a file changelog's
    does, that records exist although the task partition has no checkpoint. The runtime asks
    :meth:`stored_history` only then (one listing per stream partition, never when a checkpoint
    exists): every task partition gets a checkpoint before its first write, so records found there
    were committed under a checkpoint that is now lost."""

    def stored_history(self) -> StoredHistory | None:
        """What the partition's storage holds (committed or not), listed once; None if nothing."""


@runtime_checkable
class DurableCheckpoints(Protocol):
    """A system that keeps the job's checkpoints next to its changelogs on durable shared storage
    (so a driver restarted on another host continues). Systems without it leave checkpoints in the
    driver's state directory."""

    def checkpoint_objects(self, job: str) -> Any:
        """The :class:`~localstate.core.checkpoint.CheckpointObjects` where ``job`` keeps its checkpoints."""


@runtime_checkable
class EpochCheckpoints(Protocol):
    """A :class:`DurableCheckpoints` system that keeps a job's state epochs (docs/state-as-data.md) in
    its durable storage: the checkpoints of epoch ``epoch`` (> 0; epoch 0's are
    :meth:`DurableCheckpoints.checkpoint_objects`), and small job objects such as the pointer naming
    the current epoch, each replaced whole and atomically by a write."""

    def epoch_checkpoint_objects(self, job: str, epoch: int) -> Any:
        """The :class:`~localstate.core.checkpoint.CheckpointObjects` of ``job``'s epoch ``epoch``."""

    def read_job_object(self, job: str, name: str) -> bytes | None:
        """The bytes of ``job``'s object ``name``, None if there is none."""

    def write_job_object(self, job: str, name: str, data: bytes) -> None:
        """Replace ``job``'s object ``name`` with ``data``, atomically (a reader sees the old or the new)."""

    def delete_job_object(self, job: str, name: str) -> None:
        """Delete ``job``'s object ``name`` (missing is fine)."""


@runtime_checkable
class ManifestedStreams(Protocol):
    """A system whose partitions are :class:`ManifestedChangelog`: ``localstate inspect`` lists the
    objects a checkpoint's manifest names (the reader itself comes from :class:`ReadOnlyPartitions`)."""

    def manifest_objects(self, manifest: Mapping[str, Any]) -> list[tuple[str, int]]:
        """``(where, bytes)`` of every object ``manifest`` names, oldest first."""
