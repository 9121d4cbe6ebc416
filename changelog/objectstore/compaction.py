"""Compaction of a partition's chain into a snapshot body: the last record of each key, tombstones
dropped, records copied verbatim (offset and crc kept) in offset order.

:class:`LatestRecords` is kept by a writer between its snapshots, so each snapshot merges only the
deltas written since the previous one (Python work proportional to the new records) and joins the
surviving records in C; :func:`compact_objects` is the one-shot form (a chain adopted from another
host, or after a failed snapshot)."""

from __future__ import annotations

import struct
from typing import Iterable

from localstate.changelog.file.format import HEADER, HEADER_SIZE, TOMBSTONE

__all__ = ["LatestRecords", "compact_objects"]

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
        """Apply the records of ``body`` (one object's records in the file framing, in offset order,
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
    """Last record per key over ``parts`` (object bodies in the file framing, oldest first), tombstones
    dropped: ``(body, records)``, in offset order."""
    state = LatestRecords()
    for body in parts:
        state.merge(body, state.end)
    return state.body()
