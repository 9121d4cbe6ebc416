"""On-disk record format of the file changelog, and the low-level scanning helpers shared by the
writer (tail recovery), the readers and compaction.

A segment file is a plain concatenation of records, no file header. One record::

    crc32   u32   zlib.crc32 of every byte of the record after this field
    offset  u64   the record's offset in the partition (consecutive when written; gaps after compaction)
    ts_ms   i64   append time, milliseconds since the epoch (tombstone retention)
    klen    u32   key length
    vlen    i32   value length, -1 = tombstone (no value bytes)
    key     klen bytes
    value   max(vlen, 0) bytes

All integers little endian (``struct`` format ``<IQqIi``, 28 bytes).

The per-record loops (:func:`encode_into` here, the restore decoder in ``partition``) run in C when
the optional extension ``_framing`` (``_framing.c``) was built at install, unless the environment
variable ``LOCALSTATE_PURE_PYTHON`` asks for Python (see ``localstate.core.native``). The Python versions
(``py_encode_into``, ``partition.py_decode_columns``) are the reference: the C ones frame and accept
exactly the same bytes, and the tests run both on the same input.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path
from typing import Callable, Iterable

from localstate.core.native import load as load_native

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "REST",
    "TOMBSTONE",
    "MAX_KEY",
    "MAX_VALUE",
    "SEGMENT_SUFFIX",
    "segment_name",
    "list_segments",
    "valid_record_at",
    "walk",
    "py_walk",
    "find_valid_after",
    "encode_into",
    "py_encode_into",
    "count_records",
    "NATIVE",
]

HEADER = struct.Struct("<IQqIi")
HEADER_SIZE = HEADER.size
#: The header without its crc field: what the writer packs before computing the crc.
REST = struct.Struct("<QqIi")
CRC = struct.Struct("<I")
U64 = struct.Struct("<Q")
TOMBSTONE = -1
MAX_KEY = (1 << 32) - 1
MAX_VALUE = (1 << 31) - 1
SEGMENT_SUFFIX = ".log"
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")


def segment_name(base: int) -> str:
    """File name of the segment whose first offset is ``base``."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    """Sorted base offsets of the segment files in ``directory`` (temp files are ignored)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    bases = []
    for name in names:
        match = _SEGMENT_RE.match(name)
        if match:
            bases.append(int(match.group(1)))
    bases.sort()
    return bases


def valid_record_at(buf: bytes, pos: int, min_offset: int) -> bool:
    """True if a complete record with a correct crc and offset >= ``min_offset`` starts at ``pos``."""
    n = len(buf)
    if pos < 0 or pos + HEADER_SIZE > n:
        return False
    crc, off, _ts, klen, vlen = HEADER.unpack_from(buf, pos)
    if vlen < TOMBSTONE or off < min_offset:
        return False
    end = pos + HEADER_SIZE + klen + (vlen if vlen > 0 else 0)
    if end > n:
        return False
    return zlib.crc32(memoryview(buf)[pos + 4:end]) == crc


def py_walk(buf: bytes, pos: int, expected: int) -> tuple[int, int, int | None]:
    """Validate records from byte ``pos`` on; ``expected`` is the lowest allowed next offset.

    Returns ``(valid_end, next_offset, bad_pos)``: the byte position after the last valid record,
    the offset after it, and the position of the first incomplete/invalid record (None when the
    buffer ends exactly at a record boundary). :func:`walk` is this, or its C version when built.
    """
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    n = len(buf)
    with memoryview(buf) as view:
        while pos + HEADER_SIZE <= n:
            crc, off, _ts, klen, vlen = unpack(buf, pos)
            end = pos + HEADER_SIZE + klen + (vlen if vlen > 0 else 0)
            if end > n or vlen < TOMBSTONE or off < expected or crc32(view[pos + 4:end]) != crc:
                return pos, expected, pos
            expected = off + 1
            pos = end
    return pos, expected, (pos if pos < n else None)


def find_valid_after(buf: bytes, bad_pos: int, expected: int) -> int | None:
    """Position of a valid record after the bad record at ``bad_pos``, or None.

    Decides "torn tail" (None: nothing valid follows, the bytes can be dropped) versus
    "corruption" (a valid record follows). Two probes: (1) trust the bad record's own length fields
    and test the record right after it; (2) search for the offset field of the next one or two
    offsets (the active segment is never compacted, so its offsets are consecutive) anywhere after
    ``bad_pos`` and test each hit. A zero-filled or partially written tail matches neither.
    """
    n = len(buf)
    if bad_pos + HEADER_SIZE <= n:
        _crc, _off, _ts, klen, vlen = HEADER.unpack_from(buf, bad_pos)
        end = bad_pos + HEADER_SIZE + klen + (vlen if vlen > 0 else 0)
        if end < n and valid_record_at(buf, end, expected):
            return end
    for candidate in (expected + 1, expected + 2):
        pattern = U64.pack(candidate)
        hit = buf.find(pattern, bad_pos + 1)
        while hit != -1:
            if valid_record_at(buf, hit - 4, expected):
                return hit - 4
            hit = buf.find(pattern, hit + 1)
    return None


def py_encode_into(buf: bytearray, records: Iterable[tuple[bytes, bytes | None]], offset: int,
                   ts_ms: int) -> int:
    """Append ``records`` to ``buf`` in this format, numbered from ``offset``; returns the next offset.

    The one framing pass of every writer (the file changelog's ``append``/``append_many``, the object
    store's deltas): one concatenation and one crc32 call per record (cheaper than chaining crc32 over
    three parts, and measured faster than framing column-wise with ``map``s: the per-record crc32
    dominates either way). Raises TypeError/struct.error/OverflowError on a record that is not bytes
    or too long; the records before it stay in ``buf``, whole (see :func:`count_records`).

    :func:`encode_into` is this function, or its C version (about 15 times faster) when built."""
    pack_rest = REST.pack
    pack_crc = CRC.pack
    crc32 = zlib.crc32
    for key, value in records:
        # a bad record fails in len()/pack()/concatenation, before any byte of it is appended
        if value is None:
            record = pack_rest(offset, ts_ms, len(key), TOMBSTONE) + key
        else:
            record = pack_rest(offset, ts_ms, len(key), len(value)) + key + value
        buf += pack_crc(crc32(record))
        buf += record
        offset += 1
    return offset


#: The C framing module when it is in use, else None (``localstate doctor`` and the tests report it).
NATIVE = load_native("localstate.changelog.file._framing")
encode_into: Callable[[bytearray, Iterable[tuple[bytes, bytes | None]], int, int], int] = (
    py_encode_into if NATIVE is None else NATIVE.encode_into)
walk: Callable[[bytes, int, int], tuple[int, int, int | None]] = py_walk if NATIVE is None else NATIVE.walk


def count_records(buf: bytes | bytearray, start: int = 0) -> int:
    """How many whole records ``buf`` holds from byte ``start`` (records framed by :func:`encode_into`,
    not checked)."""
    count, pos, n = 0, start, len(buf)
    unpack = HEADER.unpack_from
    while pos + HEADER_SIZE <= n:
        _crc, _off, _ts, klen, vlen = unpack(buf, pos)
        pos += HEADER_SIZE + klen + (vlen if vlen > 0 else 0)
        count += 1
    return count
