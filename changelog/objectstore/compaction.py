"""Compaction of a partition's chain into a snapshot body: the last record of each key, tombstones
dropped, records copied verbatim (offset and crc kept) in offset order.

:class:`LatestRecords` is kept by a writer between its snapshots, so each snapshot merges only the
deltas written since the previous one (Python work proportional to the new records) and joins the
surviving records in C; :func:`compact_objects` is the one-shot form (a chain adopted from another
host, or after a failed snapshot); :class:`SnapshotBuilder` builds and writes one writer's snapshots
with it (on the writer's snapshot thread or in the compactor subprocess, :mod:`.compactor`)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Iterable, Mapping

from localstate.changelog.framing import HEADER, HEADER_SIZE, TOMBSTONE

from .chain import DELTA, OBJECT_HEADER, SNAPSHOT, ChainObject, decode_object, missing_object, object_header, \
    parse_name, partition_prefix, snapshot_name

if TYPE_CHECKING:
    from .storage import ObjectStore

__all__ = ["LatestRecords", "compact_objects", "SnapshotBuilder", "read_body"]

#: The key and value lengths at the end of a record's header (``klen u32, vlen i32``): all a merge reads.
_LENGTHS = struct.Struct("<Ii")
_LENGTHS_AT = HEADER.size - _LENGTHS.size


class LatestRecords:
    """The last record (framed bytes) of every live key of a chain up to offset :attr:`end`.

    A dict keeps insertion order, and a key re-inserted on each update moves to the end, so its
    values are the surviving records by increasing offset with no sort. Values are copies of the
    records (not views into the bodies they came from), so no old delta body is kept alive."""

    def __init__(self, tag: object = None) -> None:
        self.latest: dict[bytes, bytes] = {}
        self.end = 0
        self.tag = tag  # what the owner needs to tell whether this state still matches its chain

    def merge(self, body: bytes, end: int) -> None:
        """Apply the records of ``body`` (one object's records in the changelog record format, in offset order,
        all at or after :attr:`end`); afterwards the state covers the records below ``end``."""
        latest = self.latest
        pop = latest.pop
        unpack = _LENGTHS.unpack_from
        position, size = 0, len(body)
        while position < size:
            start = position
            klen, vlen = unpack(body, start + _LENGTHS_AT)
            key_end = start + HEADER_SIZE + klen
            key = body[start + HEADER_SIZE:key_end]
            pop(key, None)  # re-inserted below: the key moves to the end (offset order)
            if vlen == TOMBSTONE:
                position = key_end
            else:
                position = key_end + vlen
                latest[key] = body[start:position]
        self.end = end

    def body(self) -> tuple[bytes, int]:
        """``(snapshot body, records)``: the surviving records joined in offset order."""
        return b"".join(self.latest.values()), len(self.latest)


def compact_objects(parts: Iterable[bytes]) -> tuple[bytes, int]:
    """Last record per key over ``parts`` (object bodies in the changelog record format, oldest first), tombstones
    dropped: ``(body, records)``, in offset order."""
    state = LatestRecords()
    for body in parts:
        state.merge(body, state.end)
    return state.body()


def read_body(store: "ObjectStore", item: ChainObject, *, stream: str, partition: int) -> bytes:
    """The verified record body of one chain object of ``stream``/``partition``, read from storage."""
    key = f"{partition_prefix(stream, partition)}/{item.name}"
    try:
        data = store.get(key)
    except FileNotFoundError:
        raise missing_object(store.where(key), item, stream=stream, partition=partition) from None
    decode_object(data, item, stream=stream, partition=partition, where=store.where(key))
    return data[OBJECT_HEADER.size:]


class SnapshotBuilder:
    """Builds and writes one writer's snapshots of a partition, incrementally.

    It keeps the :class:`LatestRecords` of its last snapshot (tagged with the writer's adopt epoch),
    so a snapshot merges only the deltas after it; deltas :meth:`feed` hands over in order are merged
    at once (the work is spread over the commits, not bunched at the snapshot). Bodies it does not
    hold are read from storage (a chain adopted from another host). Used on the writer's snapshot
    thread, and in the compactor subprocess (:mod:`.compactor`): the same code in both."""

    def __init__(self, store: "ObjectStore", stream: str, partition: int, writer: str) -> None:
        self.store = store
        self.stream = stream
        self.partition = partition
        self.writer = writer
        self._state: LatestRecords | None = None
        self._held: dict[str, bytes] = {}  # fed deltas not merged yet (they did not follow the state)

    def adopt(self, epoch: int, fresh: bool) -> None:
        """A new chain (epoch): ``fresh`` if it is empty (the state starts at offset 0), else the
        next snapshot compacts it from its objects once."""
        self._state = LatestRecords(tag=epoch) if fresh else None
        self._held = {}

    def feed(self, epoch: int, delta: ChainObject, body: bytes) -> None:
        """One delta of chain ``epoch`` (its record body), in offset order."""
        state = self._state
        if state is not None and state.tag == epoch and state.end == delta.start:
            self._state = None  # a failure mid-merge leaves no half-merged state behind
            state.merge(body, delta.end)
            self._state = state
        else:
            self._held[delta.name] = body

    def build(self, objects: list[ChainObject], epoch: int, bodies: Mapping[str, bytes | None] | None = None
              ) -> tuple[ChainObject, bytes]:
        """Compact ``objects`` (chain ``epoch``'s snapshot and deltas, in order) into one snapshot
        object, write it (durable when this returns) and return it with its record body. ``bodies``:
        record bodies the caller holds, by object name. Raises LocalStateError on a storage failure
        (the kept state is then dropped: the next build starts over)."""
        state, self._state = self._state, None
        end = objects[-1].end
        usable = state is not None and state.tag == epoch and (
            state.end == end or any(item.kind == DELTA and item.start == state.end for item in objects))
        if usable:
            assert state is not None
            pending = [item for item in objects if item.kind == DELTA and item.start >= state.end]
        else:
            state, pending = LatestRecords(tag=epoch), objects
        for item in pending:
            body = self._held.get(item.name) or (bodies or {}).get(item.name)
            if body is None:
                body = read_body(self.store, item, stream=self.stream, partition=self.partition)
            state.merge(body, item.end)
        body, count = state.body()
        name = snapshot_name(end, self.writer)
        data = object_header(SNAPSHOT, self.writer, 0, end, count) + body
        self.store.put(f"{partition_prefix(self.stream, self.partition)}/{name}", data)
        self._state = state
        self._held = {name: held for name, held in self._held.items() if _delta_end(name) > end}
        return ChainObject(name, SNAPSHOT, 0, end, count, len(data), self.writer), body


def _delta_end(name: str) -> int:
    parsed = parse_name(name)
    return parsed[2] if parsed is not None else 0
