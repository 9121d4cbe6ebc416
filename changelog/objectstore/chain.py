"""The objects of one ``objectstore`` changelog partition and the manifest naming its committed chain.

Object keys below the store's base::

    changelogs/<stream>/stream.json                                        {"format": 1, "partitions": N}
    changelogs/<stream>/<p>/deltas/<start:020d>-<end:020d>-<writer>.delta  records [start, end), one flush
    changelogs/<stream>/<p>/snapshots/<end:020d>-<writer>.snapshot         last record per key below end

``<writer>`` is a fresh random token per opened partition, so no two writers (a live one and a
zombie, say) ever write the same key. An object is a fixed header followed by records in the shared
changelog record format (:mod:`localstate.changelog.framing`: crc, offset, timestamp, lengths)::

    magic  6s  b"LSOBJ1"
    kind   u8  1 = delta, 2 = snapshot
    writer 16s the writer token (raw bytes of its 32 hex digits)
    start  u64 first offset the object covers (0 for a snapshot)
    end    u64 the offset after it
    count  u64 records in the object

A chain is an optional snapshot plus the deltas after it, contiguous up to the partition's end. The
manifest (JSON, stored in the checkpoint) names it; reading verifies every object against it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

from localstate.changelog.framing import decode_records
from localstate.core.changelog import ChangelogRecord
from localstate.errors import ChangelogCorruptError, ChangelogError

__all__ = ["ChainObject", "Chain", "OBJECT_HEADER", "DELTA", "SNAPSHOT", "MANIFEST_FORMAT", "delta_name",
           "snapshot_name", "parse_name", "object_header", "decode_object", "partition_prefix", "stream_prefix"]

OBJECT_HEADER = struct.Struct("<6sB16sQQQ")
MAGIC = b"LSOBJ1"
DELTA, SNAPSHOT = 1, 2
MANIFEST_FORMAT = 1
_DELTA_RE = re.compile(r"^deltas/(\d{20})-(\d{20})-([0-9a-f]{32})\.delta$")
_SNAPSHOT_RE = re.compile(r"^snapshots/(\d{20})-([0-9a-f]{32})\.snapshot$")
_DAMAGED_HINT = ("the object named by the checkpoint is damaged or missing in shared storage: restore it from a "
                 "backup or storage versioning, or run `localstate reset` to rebuild the job's state from its inputs")


def stream_prefix(stream: str) -> str:
    return f"changelogs/{stream}"


def partition_prefix(stream: str, partition: int) -> str:
    return f"changelogs/{stream}/{int(partition)}"


def delta_name(start: int, end: int, writer: str) -> str:
    return f"deltas/{start:020d}-{end:020d}-{writer}.delta"


def snapshot_name(end: int, writer: str) -> str:
    return f"snapshots/{end:020d}-{writer}.snapshot"


@dataclass(frozen=True)
class ChainObject:
    """One object of a chain, as the manifest names it."""

    name: str
    kind: int
    start: int
    end: int
    records: int
    size: int
    writer: str

    def to_json(self) -> dict[str, Any]:
        return {"object": self.name, "start": self.start, "end": self.end, "records": self.records,
                "bytes": self.size}


def parse_name(name: str) -> tuple[int, int, int, str] | None:
    """``(kind, start, end, writer)`` of an object name this package produces, else None."""
    match = _DELTA_RE.match(name)
    if match:
        return DELTA, int(match.group(1)), int(match.group(2)), match.group(3)
    match = _SNAPSHOT_RE.match(name)
    if match:
        return SNAPSHOT, 0, int(match.group(1)), match.group(2)
    return None


def object_header(kind: int, writer: str, start: int, end: int, count: int) -> bytes:
    return OBJECT_HEADER.pack(MAGIC, kind, bytes.fromhex(writer), start, end, count)


@dataclass
class Chain:
    """A partition's committed chain: the snapshot (if any) and the contiguous deltas after it."""

    stream: str
    partition: int
    snapshot: ChainObject | None = None
    deltas: list[ChainObject] | None = None

    def __post_init__(self) -> None:
        if self.deltas is None:
            self.deltas = []

    @property
    def end(self) -> int:
        if self.deltas:
            return self.deltas[-1].end
        return self.snapshot.end if self.snapshot is not None else 0

    def objects(self) -> list[ChainObject]:
        return ([self.snapshot] if self.snapshot is not None else []) + list(self.deltas or ())

    def to_manifest(self) -> dict[str, Any]:
        return {"format": MANIFEST_FORMAT, "stream": self.stream, "partition": self.partition, "end": self.end,
                "snapshot": self.snapshot.to_json() if self.snapshot is not None else None,
                "deltas": [delta.to_json() for delta in self.deltas or ()]}

    @classmethod
    def from_manifest(cls, manifest: Any, stream: str, partition: int) -> "Chain":
        """Parse and check a manifest: every object named as this package names them, sizes and
        offsets consistent, deltas contiguous after the snapshot (ChangelogError otherwise)."""
        def bad(problem: str) -> ChangelogError:
            return ChangelogError(f"the checkpoint's manifest of changelog {stream!r} partition {partition} is "
                                  f"invalid: {problem}", stream=stream, partition=partition,
                                  hint="the checkpoint is damaged: restore it from a backup or run `localstate reset`")

        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise bad(f"unknown manifest format {manifest.get('format') if isinstance(manifest, dict) else manifest!r:.40}")
        if manifest.get("stream", stream) != stream or manifest.get("partition", partition) != partition:
            raise bad(f"it belongs to {manifest.get('stream')!r} partition {manifest.get('partition')!r}")

        def entry(raw: Any, kind: int) -> ChainObject:
            if not isinstance(raw, dict):
                raise bad(f"expected an object entry, got {raw!r:.60}")
            name = raw.get("object")
            parsed = parse_name(name) if isinstance(name, str) else None
            if parsed is None or parsed[0] != kind:
                raise bad(f"{name!r:.80} is not {'a delta' if kind == DELTA else 'a snapshot'} object name")
            numbers = [raw.get(k) for k in ("start", "end", "records", "bytes")]
            if any(type(n) is not int or n < 0 for n in numbers):
                raise bad(f"entry {name}: start, end, records and bytes must be non-negative integers")
            start, end, records, size = numbers
            if (start, end) != (parsed[1], parsed[2]) or (kind == DELTA and records != end - start):
                raise bad(f"entry {name}: offsets/records do not match the object's name")
            return ChainObject(name, kind, start, end, records, size, parsed[3])

        snapshot = entry(manifest["snapshot"], SNAPSHOT) if manifest.get("snapshot") is not None else None
        raw_deltas = manifest.get("deltas", [])
        if not isinstance(raw_deltas, list):
            raise bad("deltas must be a list")
        deltas = [entry(raw, DELTA) for raw in raw_deltas]
        position = snapshot.end if snapshot is not None else 0
        for delta in deltas:
            if delta.start != position:
                raise bad(f"delta {delta.name} starts at {delta.start}, expected {position} (the chain has a gap)")
            position = delta.end
        chain = cls(stream, partition, snapshot, deltas)
        if manifest.get("end") != chain.end:
            raise bad(f"end {manifest.get('end')!r} does not match the chain's end {chain.end}")
        return chain


def decode_object(data: bytes, item: ChainObject, *, stream: str, partition: int,
                  where: str) -> list[ChangelogRecord]:
    """Every record of ``item``'s object bytes, verified: size, header (kind, writer, offsets, count),
    each record's crc and offset. ChangelogCorruptError naming the object otherwise."""
    def corrupt(problem: str) -> ChangelogCorruptError:
        return ChangelogCorruptError(f"changelog object {where} is damaged: {problem}", stream=stream,
                                     partition=partition, path=where, offset=item.start, hint=_DAMAGED_HINT)

    if len(data) != item.size:
        raise corrupt(f"{len(data)} bytes, the manifest says {item.size}")
    if len(data) < OBJECT_HEADER.size:
        raise corrupt("shorter than its header")
    magic, kind, writer, start, end, count = OBJECT_HEADER.unpack_from(data, 0)
    if magic != MAGIC or kind != item.kind:
        raise corrupt("not a localstate changelog object of the expected kind")
    if writer.hex() != item.writer:
        raise corrupt(f"written by writer {writer.hex()}, its name says {item.writer}")
    if (start, end, count) != (item.start, item.end, item.records):
        raise corrupt(f"header covers [{start}, {end}) with {count} records, the manifest says "
                      f"[{item.start}, {item.end}) with {item.records}")
    records, position, _next = decode_records(data, OBJECT_HEADER.size, len(data), start, end)
    if position != len(data) or len(records) != count:
        bad = records[-1].offset + 1 if records else start
        raise ChangelogCorruptError(f"changelog object {where} is damaged: a record near offset {bad} (byte "
                                    f"{position}) fails its integrity check", stream=stream, partition=partition,
                                    path=where, offset=bad, byte=position, hint=_DAMAGED_HINT)
    return records


def missing_object(where: str, item: ChainObject, *, stream: str, partition: int) -> ChangelogError:
    """The error for an object the committed chain names that storage does not hold."""
    return ChangelogError(f"changelog object {where} named by the checkpoint is missing (records "
                          f"[{item.start}, {item.end}))", stream=stream, partition=partition, path=where,
                          offset=item.start, hint=_DAMAGED_HINT)
