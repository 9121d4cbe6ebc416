"""The changelog record format: one owner for the layout every changelog that stores framed records
shares (the ``file`` changelog's segments, the ``objectstore`` changelog's delta and snapshot objects),
with its encoder, validating walk and decoders, their C versions and their Python reference twins.

One record::

    crc32   u32   zlib.crc32 of every byte of the record after this field
    offset  u64   the record's offset in the partition (consecutive when written; gaps after compaction)
    ts_ms   i64   append time, milliseconds since the epoch (tombstone retention)
    klen    u32   key length
    vlen    i32   value length, -1 = tombstone (no value bytes)
    key     klen bytes
    value   max(vlen, 0) bytes

All integers little endian (``struct`` format ``<IQqIi``, 28 bytes). A run of records is their plain
concatenation, no header.

The per-record loops (:func:`encode_into`, :func:`walk`, :func:`decode_columns`, :func:`decode_records`,
:func:`split_point`) run in C when the optional extension ``localstate.native._framing`` (``native/_framing.c``) was built at
install, unless the environment variable ``LOCALSTATE_PURE_PYTHON`` asks for Python (see
``localstate.native``). The Python versions here (``py_encode_into``, ``py_walk``, ``py_decode_columns``,
``py_decode``, ``py_split_point``) are the reference: the C ones frame and accept exactly the same bytes, and
``tests/native/test_differential.py`` runs both on the same input.
"""

from __future__ import annotations

import struct
import zlib
from typing import Callable, Iterable

from localstate.core.changelog import ChangelogRecord, RecordColumns
from localstate.native import load as load_native

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "REST",
    "TOMBSTONE",
    "MAX_KEY",
    "MAX_VALUE",
    "valid_record_at",
    "walk",
    "py_walk",
    "find_valid_after",
    "encode_into",
    "py_encode_into",
    "count_records",
    "split_point",
    "py_split_point",
    "decode_columns",
    "py_decode_columns",
    "decode_records",
    "py_decode",
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


#: The C framing module (``localstate.native._framing``) when it is in use, else None.
NATIVE = load_native("localstate.native._framing")
encode_into: Callable[[bytearray, Iterable[tuple[bytes, bytes | None]], int, int], int] = (
    py_encode_into if NATIVE is None else NATIVE.encode_into)
walk: Callable[[bytes, int, int], tuple[int, int, int | None]] = py_walk if NATIVE is None else NATIVE.walk


def py_split_point(buf: bytes | bytearray, pos: int, room: int) -> tuple[int, int]:
    """The byte position after the record (of those framed from byte ``pos``) at which ``room`` bytes
    are reached, or the buffer ends, and the offset after that record: where a run is cut when only
    ``room`` bytes fit (at least one record is taken). The reference version of :func:`split_point`."""
    unpack = HEADER.unpack_from
    n = len(buf)
    start = pos
    while True:
        _crc, off, _ts, klen, vlen = unpack(buf, pos)
        pos += HEADER_SIZE + klen + (vlen if vlen > 0 else 0)
        if pos - start >= room or pos >= n:
            return pos, off + 1


split_point: Callable[[bytes | bytearray, int, int], tuple[int, int]] = (
    py_split_point if NATIVE is None else NATIVE.split_point)


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


def py_decode(buf: bytes, i: int, limit: int, expected: int,
              stop: int) -> tuple[list[ChangelogRecord], int, int]:
    """Decode the records from byte ``i`` on (those starting before ``limit``) that are complete, pass
    their crc and have ``expected <= offset < stop``; stop before the first one that does not.

    Returns ``(records, position after the last one, lowest offset the next record may carry)``.
    A ``limit`` past the last whole header is taken as that header's position (a damaged tail shorter
    than a header stops the loop, it does not fail it). This is the restore hot path: one tight loop,
    no per-record function of our own. The reference version of :func:`decode_records`, which runs the loop
    in C when the framing extension is in use (:data:`NATIVE`).
    """
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    new = object.__new__
    record = ChangelogRecord
    set_key, set_value, set_offset = _SET_KEY, _SET_VALUE, _SET_OFFSET
    hs = HEADER_SIZE
    n = len(buf)
    limit = min(limit, n - hs + 1)
    records: list[ChangelogRecord] = []
    append = records.append
    with memoryview(buf) as view:
        while i < limit:
            crc, off, _ts, klen, vlen = unpack(buf, i)
            kstart = i + hs
            kend = kstart + klen
            end = kend + vlen if vlen > 0 else kend
            # The crc covers offset, lengths, key and value; ``expected <= off`` catches misplaced records.
            if end > n or crc32(view[i + 4:end]) != crc or not expected <= off < stop:
                break
            # Build the frozen slots dataclass through its slot descriptors: half the cost of its
            # generated __init__.
            rec = new(record)
            set_key(rec, buf[kstart:kend])
            set_value(rec, buf[kend:end] if vlen >= 0 else None)
            set_offset(rec, off)
            append(rec)
            expected = off + 1
            i = end
    return records, i, expected


def py_decode_columns(buf: bytes, i: int, limit: int, expected: int,
                      stop: int) -> tuple[RecordColumns, int, int]:
    """:func:`py_decode` into a :class:`RecordColumns` run: the same checks, the same stopping rule,
    keys and values appended to two lists instead of building a record object each.

    The reference version of :func:`decode_columns`, which runs the loop in C when the framing
    extension is in use (:data:`NATIVE`)."""
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    hs = HEADER_SIZE
    n = len(buf)
    limit = min(limit, n - hs + 1)
    start = i
    keys: list[bytes] = []
    values: list[bytes | None] = []
    add_key, add_value = keys.append, values.append
    with memoryview(buf) as view:
        while i < limit:
            crc, off, _ts, klen, vlen = unpack(buf, i)
            kend = i + hs + klen
            end = kend + vlen if vlen > 0 else kend
            if end > n or crc32(view[i + 4:end]) != crc or not expected <= off < stop:
                break
            add_key(buf[kend - klen:kend])
            add_value(buf[kend:end] if vlen >= 0 else None)
            expected = off + 1
            i = end
    return RecordColumns(keys, values, expected, i - start), i, expected


def _native_decode_columns(buf: bytes, i: int, limit: int, expected: int,
                           stop: int) -> tuple[RecordColumns, int, int]:
    """:func:`py_decode_columns` with its loop in C. From a ``bytes`` buffer (what the reader holds)
    the run is framed (``NATIVE.decode_frames``: the same checks, no object per record; see
    :meth:`RecordColumns.from_frames`), else decoded into lists (``decode_columns``)."""
    if _NATIVE_DECODE_FRAMES is not None and type(buf) is bytes:
        spans, count, end, expected = _NATIVE_DECODE_FRAMES(buf, i, limit, expected, stop)
        return RecordColumns.from_frames(buf, spans, count, expected, end - i), end, expected
    keys, values, end, expected = _NATIVE_DECODE(buf, i, limit, expected, stop)
    return RecordColumns(keys, values, expected, end - i), end, expected


def _native_decode(buf: bytes, i: int, limit: int, expected: int,
                   stop: int) -> tuple[list[ChangelogRecord], int, int]:
    """:func:`py_decode` with its loop in C (``NATIVE.decode_records``)."""
    return _NATIVE_DECODE_RECORDS(buf, i, limit, expected, stop, ChangelogRecord, *_RECORD_SLOTS)


_NATIVE_DECODE = None if NATIVE is None else NATIVE.decode_columns
_NATIVE_DECODE_FRAMES = getattr(NATIVE, "decode_frames", None)
_NATIVE_DECODE_RECORDS = None if NATIVE is None else NATIVE.decode_records
#: Decode a run of records into a :class:`RecordColumns` (the restore path): :func:`py_decode_columns`
#: or its C version.
decode_columns: Callable[[bytes, int, int, int, int], tuple[RecordColumns, int, int]] = (
    py_decode_columns if NATIVE is None else _native_decode_columns)


def _setter(name: str) -> Callable[[ChangelogRecord, object], None]:
    """Slot setter of ChangelogRecord (a frozen slots dataclass); generic fallback otherwise."""
    descriptor = getattr(ChangelogRecord, name, None)
    if descriptor is not None and hasattr(descriptor, "__set__"):
        return descriptor.__set__
    return lambda record, value: object.__setattr__(record, name, value)


_SET_KEY = _setter("key")
_SET_VALUE = _setter("value")
_SET_OFFSET = _setter("offset")
#: ChangelogRecord's slot descriptors, which the C decoder fills (None: not a slots class)
_RECORD_SLOTS = tuple(getattr(ChangelogRecord, name, None) for name in ("key", "value", "offset"))
#: Decode a run of records into :class:`ChangelogRecord` objects (the readers, and the ``objectstore``
#: changelog's delta and snapshot objects): :func:`py_decode` or its C version.
decode_records: Callable[[bytes, int, int, int, int], tuple[list[ChangelogRecord], int, int]] = (
    py_decode if NATIVE is None or not all(hasattr(slot, "__set__") for slot in _RECORD_SLOTS)
    else _native_decode)
