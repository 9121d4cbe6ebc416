"""JSON-lines streams: a directory with one file per partition, ``<path>/<partition>.jsonl``.

Each line is ``{"key": ..., "value": ..., "ts": ...}``; the offset of a record is its line number.
A last line without its newline is an append in progress and is not read. As an output, a task
partition appends (and fsyncs) to its own file; rollback truncates to a line count.

An output partition rolls into segments once its active file holds ``segment_bytes``: the first
segment is ``<partition>.jsonl`` (offsets from 0), each later one ``<partition>.<base:020d>.jsonl``,
whose first line is offset ``base`` of the partition. Offsets (the checkpoint's output position)
stay global line numbers across segments; readers (:func:`read_jsonl`, the ``jsonl`` input) see
the segments as one stream.
"""

from __future__ import annotations

import json
import json.scanner
import os
import re
from itertools import islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Iterable, Iterator, Mapping, NamedTuple

import numpy as np

from localstate.core.config import JobConfig, StreamConfig
from localstate.core.filewatch import FileWatch, WatchedFiles, wait_for_files
from localstate.core.fsutil import fsync_dir, open_nofollow, os_error
from localstate.core.options import Option, parse_path, parse_size
from localstate.core.partitioner import partition_for
from localstate.core.serdes import STRICT_JSON, json_problem
from localstate.errors import InputError, OutputError, OutputIOError

from localstate.core.routing import ROUTING_OPTIONS
from localstate.core.stream import (COLUMN_ROWS, NO_BOUNDS, BadTimestamp, FileIdentities, InputColumns,
                                          InputRecord, InputStream, OutputStream, StreamSystem, TimestampRule,
                                          check_output_file, open_regular_file, resolve_path)

try:  # optional (the "columnar" extra): a faster parser for a batch task's input, see read_columns
    from orjson import loads as _ORJSON_LOADS
except ImportError:  # pragma: no cover - without it every line takes the json serde's decoder
    _ORJSON_LOADS = None

__all__ = ["JsonLinesInput", "JsonLinesOutput", "write_jsonl", "read_jsonl", "by_key_partition"]


_DECODER = STRICT_JSON
# The decoder's C scanner, called directly: a line that is exactly one JSON value followed by its
# newline (the usual case) skips JSONDecoder.decode's Python wrapper and whitespace regexes. Any
# other line goes through decode, which returns the same value or raises the same error. The decoder
# and json_problem are the json serde's: what it could not encode again (NaN, Infinity, 1e400, lone
# surrogates, deep nesting) is an undecodable record here, where on_error can still handle it.
_SCAN = json.scanner.c_make_scanner(_DECODER) if json.scanner.c_make_scanner else _DECODER.scan_once
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_WIDE_NUMBER = b"0" * 19
"""19 digits in a row (once every digit reads ``0``): maybe an integer beyond 64 bits, which orjson
reads as a float (the json serde's decoder as an int), so such a line is not parsed by orjson. A
translate and a substring search: several times faster than a regular expression over the chunk."""
READ_ROWS = 16 * COLUMN_ROWS
"""Lines a batch task's read takes at a time (:meth:`JsonLinesInput.read_columns`), up to
:data:`READ_BYTES`: a chunk Arrow's JSON reader takes whole is one batch, so few batch task calls per
micro-batch (each call, and each of its store calls, has a fixed cost; a key repeated within the
batch is merged once)."""
READ_BYTES = 16 << 20
"""Bytes of lines a read takes at a time, at most (lines of any size keep memory bounded)."""
_POSITIONS: dict[tuple[str, int, int], int] = {}
"""(file, inode, line offset) -> byte position, remembered by this process for the next batch (the
inode: a file replaced under the job is never read from a position remembered in the old one)."""


def _text(exc: BaseException) -> str:
    """An exception's message, safe to write anywhere (no lone surrogates, bounded length)."""
    return str(exc)[:500].encode("utf-8", "backslashreplace").decode("utf-8")


def _file(directory: Path, partition: int) -> Path:
    return directory / f"{int(partition)}.jsonl"


#: Default size at which an output partition's active segment is closed and a new one started.
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_SEGMENT_RE = re.compile(r"^(\d+)\.(\d{20})\.jsonl$")


def _segment_file(directory: Path, partition: int, base: int) -> Path:
    """The segment of ``partition`` whose first line is offset ``base`` (the first one: ``<p>.jsonl``)."""
    return _file(directory, partition) if base == 0 else directory / f"{int(partition)}.{base:020d}.jsonl"


def _segments(directory: Path, partition: int) -> list[tuple[int, Path]]:
    """``(base offset, path)`` of every segment of ``partition``, by base; the first segment
    (``<p>.jsonl``, base 0) is listed if it exists. One directory listing; [] if there is none."""
    out: list[tuple[int, Path]] = []
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return out
    first = f"{int(partition)}.jsonl"
    for name in names:
        if name == first:
            out.append((0, directory / name))
            continue
        match = _SEGMENT_RE.match(name)
        if match and int(match.group(1)) == int(partition) and int(match.group(2)) > 0:
            out.append((int(match.group(2)), directory / name))
    out.sort()
    return out


_LINES: dict[str, tuple[int, int, int, int]] = {}
"""file -> (inode, bytes counted, newlines in them, byte after the last newline): input files only
grow, so count only new bytes."""


class _Scan(NamedTuple):
    """What :func:`_scan_lines` found in a file."""

    lines: int
    """complete lines (each ends with its newline)"""
    pending: int
    """bytes after the last newline: a line still being appended"""
    mtime: float
    """the file's modification time (epoch seconds); 0.0 when it does not exist"""


def _scan_lines(path: Path, cache: bool = False, stream: str | None = None, partition: int = 0) -> _Scan:
    """Complete lines and unterminated bytes of ``path`` (zeros when absent). With ``stream`` (an
    input), the file must be a regular file (InputError otherwise, see :func:`open_regular_file`).
    With ``cache``, only the bytes appended since the previous call are read (same inode, not shorter)."""
    try:
        if stream is not None:
            opened = open_regular_file(path, stream=stream, partition=partition)
            if opened is None:
                return _Scan(0, 0, 0.0)
        else:
            opened = open(path, "rb")
        with opened as handle:
            stat = os.fstat(handle.fileno())
            seen = _LINES.get(str(path)) if cache else None
            base, lines, tail = 0, 0, 0
            if seen is not None and seen[0] == stat.st_ino and seen[1] <= stat.st_size:
                handle.seek(seen[1])
                base, lines, tail = seen[1], seen[2], seen[3]
            data = handle.read()
            lines += data.count(b"\n")
            last = data.rfind(b"\n")
            if last >= 0:
                tail = base + last + 1
            size = base + len(data)
            if cache:
                _LINES[str(path)] = (stat.st_ino, size, lines, tail)
            return _Scan(lines, size - tail, stat.st_mtime)
    except FileNotFoundError:
        return _Scan(0, 0, 0.0)


def _complete_lines(path: Path, cache: bool = False, stream: str | None = None, partition: int = 0) -> int:
    """Complete lines in ``path`` (0 when absent); see :func:`_scan_lines`."""
    return _scan_lines(path, cache, stream, partition).lines


def write_jsonl(directory: str | os.PathLike[str], partition: int, records: list[dict[str, Any]]) -> None:
    """Append ``records`` (dicts with key/value/ts) to ``<directory>/<partition>.jsonl`` (test/demo helper)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(_file(directory, partition), "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")


def by_key_partition(records: Iterable[dict[str, Any]], partitions: int) -> dict[int, list[dict[str, Any]]]:
    """``records`` (dicts with key/value/ts) grouped by the partition of their ``key`` under the
    Kafka-compatible partitioner (:func:`~localstate.core.partitioner.partition_for`), as a job's
    jsonl input expects them; every partition is present, in order (test/demo helper)."""
    grouped: dict[int, list[dict[str, Any]]] = {partition: [] for partition in range(partitions)}
    for record in records:
        grouped[partition_for(record["key"], partitions)].append(record)
    return grouped


def read_jsonl(directory: str | os.PathLike[str], partition: int) -> list[dict[str, Any]]:
    """Every complete line of ``<directory>/<partition>.jsonl`` and its later segments, as one
    stream: from the first segment still there (the oldest ones may have been deleted once read, see
    docs/operations.md), so the first line's offset is that segment's base. A segment missing after
    the first one, or holding other than the lines up to the next segment's base, is an OutputError
    naming the file (a segment deleted or truncated by hand)."""
    out: list[dict[str, Any]] = []
    segments = _segments(Path(directory), partition)
    first = segments[0][0] if segments else 0
    for index, (base, path) in enumerate(segments):
        if first + len(out) != base:
            _segment_gap(path, partition, base, first + len(out), segments[index - 1][1] if index else None)
        with open(path, encoding="utf-8") as handle:
            out.extend(json.loads(line) for line in handle if line.endswith("\n"))
    return out


def _segment_gap(path: Path, partition: int, base: int, found: int, previous: Path | None,
                 stream: str | None = None) -> None:
    """Raise the OutputError of segments that do not join: ``path`` starts at line ``base`` but the
    segments before it hold ``found`` lines."""
    culprit = previous if previous is not None else _file(path.parent, partition)
    raise OutputError(f"output segment {culprit} holds {'no file' if previous is None else 'lines'} up to offset "
                      f"{found}, but the next segment {path.name} starts at {base}: a segment was deleted or "
                      f"truncated by hand", stream=stream, partition=partition, path=str(culprit),
                      hint="restore the segment from a backup; localstate only deletes or truncates output "
                           "segments written after the last checkpoint (rollback)")


class JsonLinesInput(WatchedFiles, InputStream):
    system = "jsonl"
    options: ClassVar[Mapping[str, Option]] = {
        "path": Option(str, parse=parse_path, doc="directory holding <partition>.jsonl files (relative to the job file)"),
        **ROUTING_OPTIONS,
    }

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self.directory = resolve_path(job, self.config["path"])
        self._identities = FileIdentities()
        self._watch = FileWatch(self.name)

    def wait_for_records(self, positions: dict[int, int], timeout: float) -> bool:
        """See :class:`~localstate.core.stream.WaitableInput`: sleeps until a partition file of
        ``positions`` (or a later segment of one) is written or created, then checks with
        :meth:`end_offset` that a complete line lies at or past its position."""
        wanted = {str(int(partition)) for partition in positions}
        return wait_for_files(self._watch, [(self.directory, True)],
                              lambda _directory, name: name.split(".", 1)[0] in wanted,
                              lambda: any(self.end_offset(p) > at for p, at in positions.items()), timeout)

    def location(self) -> tuple[str, str]:
        return "path", str(self.directory.resolve())

    def input_directory(self) -> Path:
        return self.directory

    def identity(self, partition: int, recorded: str | None = None) -> str | None:
        """The partition's first segment file: device, inode and a fingerprint of its first bytes
        (:class:`~localstate.core.stream.IdentifiedInput`, :class:`FileIdentities`): a file
        replaced under the job, by a longer one too, is refused, an appended one is not."""
        return self._identities.identity(_segments(self.directory, partition), recorded, stream=self.name,
                                         partition=partition)

    def _last_segment(self, partition: int) -> tuple[int, Path]:
        """``(base, path)`` of the partition's last segment (a rolled output read as an input), or
        the plain ``<p>.jsonl``."""
        segments = _segments(self.directory, partition)
        return segments[-1] if segments else (0, _file(self.directory, partition))

    def start_offset(self, partition: int) -> int:
        """The first offset the partition still holds: the base of its first segment (a rolled output
        read as an input whose oldest segments were deleted), else 0 (:class:`RetainedStart`: a
        checkpoint below it is an InputPositionError, never a silent skip)."""
        segments = _segments(self.directory, partition)
        return segments[0][0] if segments else 0

    def end_offset(self, partition: int) -> int:
        base, path = self._last_segment(partition)
        return base + _complete_lines(path, cache=True, stream=self.name, partition=partition)

    def pending_bytes(self, partition: int) -> int:
        """Bytes of a last line without its newline yet (an append in progress; :class:`PendingTail`)."""
        _base, path = self._last_segment(partition)
        return _scan_lines(path, cache=True, stream=self.name, partition=partition).pending

    def pending_since(self, partition: int) -> float | None:
        """The file's modification time while it ends in an unterminated line, else None."""
        _base, path = self._last_segment(partition)
        scan = _scan_lines(path, cache=True, stream=self.name, partition=partition)
        return scan.mtime if scan.pending else None

    def read_columns(self, partition: int, start: int, end: int) -> Iterator[InputColumns]:
        """:meth:`read` as :class:`~localstate.core.stream.InputColumns` chunks (a batch task's
        input): no record tuple per row, and with orjson installed a chunk of ordinary lines parsed
        by it in one C-level pass. orjson and the json serde's decoder differ on a few inputs (orjson
        reads integers beyond 64 bits as floats, words its errors differently), so a chunk that holds
        such a line, or one orjson or the checks refuse, is decoded line by line by :func:`_decode`:
        every row is exactly what :meth:`read` yields."""
        for path, base, first, last in self._ranges(partition, start, end):
            for offset, lines in self._file_chunks(path, partition, base, first, last):
                yield from _chunk_columns(self.name, partition, offset, lines, self.timestamps)

    def read(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        for path, base, first, last in self._ranges(partition, start, end):
            yield from self._read_file(path, partition, base, first, last)

    def _ranges(self, partition: int, start: int, end: int) -> Iterator[tuple[Path, int, int, int]]:
        """``(segment, its base, start, end)`` of each segment holding offsets ``[start, end)``."""
        if start >= end:
            return
        segments = _segments(self.directory, partition) or [(0, _file(self.directory, partition))]
        for index, (base, path) in enumerate(segments):
            following = segments[index + 1][0] if index + 1 < len(segments) else None
            if base >= end:
                break
            if following is not None and following <= start:
                continue
            yield path, base, start, end if following is None else min(end, following)

    def _open_at(self, path: Path, partition: int, base: int, start: int, end: int) -> tuple[BinaryIO, int, int, int]:
        """``(handle, offset, byte position, inode)``: the segment opened at the line this process's
        previous batch stopped at when that is ``start`` (Python workers are reused across batches;
        no re-scan of every earlier line), else at its first line (offset ``base``)."""
        handle = open_regular_file(path, stream=self.name, partition=partition)
        if handle is None:
            raise InputError(f"input file {path} is missing but offsets up to {end} were planned",
                             stream=self.name, partition=partition, offset=start, path=str(path),
                             hint="input files must not be deleted while the job reads them")
        inode = os.fstat(handle.fileno()).st_ino
        hint = _POSITIONS.get((str(path), inode, start))
        if hint is not None:
            handle.seek(hint)
            return handle, start, hint, inode
        return handle, base, 0, inode

    @staticmethod
    def _remember(path: Path, inode: int, offset: int, position: int) -> None:
        if len(_POSITIONS) > 4096:
            _POSITIONS.clear()
        _POSITIONS[(str(path), inode, offset)] = position

    def _file_chunks(self, path: Path, partition: int, base: int, start: int,
                     end: int) -> Iterator[tuple[int, list[bytes]]]:
        """The complete lines ``[start, end)`` of one segment, as ``(first offset, lines)`` chunks of
        at most :data:`READ_ROWS` lines (each with its newline), ending once :data:`READ_BYTES` are
        reached."""
        handle, offset, position, inode = self._open_at(path, partition, base, start, end)
        try:
            with handle:
                while offset < start:  # lines before the range: skipped, not decoded
                    line = handle.readline()
                    if not line.endswith(b"\n"):
                        break
                    offset += 1
                    position += len(line)
                while start <= offset < end:
                    lines = _read_lines(handle, min(READ_ROWS, end - offset))
                    if lines and not lines[-1].endswith(b"\n"):
                        lines.pop()  # an append in progress: not read
                    if not lines:
                        break
                    yield offset, lines
                    offset += len(lines)
                    position += sum(map(len, lines))
        finally:  # also when the reader stops early: the next read resumes here
            self._remember(path, inode, offset, position)

    def _read_file(self, path: Path, partition: int, base: int, start: int, end: int) -> Iterator[InputRecord]:
        """The records ``[start, end)`` of one segment whose first line is offset ``base``."""
        handle, offset, position, inode = self._open_at(path, partition, base, start, end)
        name, decode, rule = self.name, _decode, self.timestamps
        previous = None  # (offset, byte position) of the last record yielded
        try:
            with handle:
                for line in handle:
                    if offset >= end or not line.endswith(b"\n"):
                        break
                    here, at = offset, position
                    offset += 1
                    position += len(line)
                    if here >= start:
                        previous = here, at
                        yield decode(name, partition, here, line, rule)
        finally:
            # Also when the reader stops early (a round's record limit): the next read resumes at the
            # line after the last record yielded, or at that record when a merge of several inputs
            # had read it ahead without feeding it. Without a remembered position, a read starts
            # again from the segment's first line.
            self._remember(path, inode, offset, position)
            if previous is not None:
                self._remember(path, inode, *previous)


def _read_lines(handle: BinaryIO, limit: int) -> list[bytes]:
    """Up to ``limit`` lines of ``handle``, taken :data:`COLUMN_ROWS` at a time until
    :data:`READ_BYTES` are reached (or the file ends, or a line has no newline yet)."""
    lines: list[bytes] = []
    size = 0
    while len(lines) < limit and size < READ_BYTES:
        more = list(islice(handle, min(COLUMN_ROWS, limit - len(lines))))
        lines += more
        size += sum(map(len, more))
        if len(more) < COLUMN_ROWS or not more[-1].endswith(b"\n"):
            break
    return lines


def _chunk_columns(stream: str, partition: int, first: int, lines: list[bytes],
                   rule: TimestampRule = NO_BOUNDS) -> Iterator[InputColumns]:
    """The rows of a read chunk (offsets from ``first``) as columns: the whole chunk as one batch when
    Arrow's JSON reader takes it exactly (:func:`_arrow_chunk`; no Python object per row, and one
    batch task call for it), else pieces of :data:`COLUMN_ROWS` lines by :func:`_columns` (a line
    Arrow refuses costs no more than it does in a chunk of that size, and the Python objects a
    line-by-line decode makes stay as few as before)."""
    if len(lines) > COLUMN_ROWS:
        columns = _arrow_chunk(stream, lines, first, rule=rule)
        if columns is not None:
            yield columns
            return
        for at in range(0, len(lines), COLUMN_ROWS):
            yield _columns(stream, partition, first + at, lines[at:at + COLUMN_ROWS], rule)
    else:
        yield _columns(stream, partition, first, lines, rule)


def _plain(lines: list[bytes]) -> bytes | None:
    """The lines joined when they are ordinary (short, no escapes, valid UTF-8): Arrow's values are
    then the json serde decoder's, and orjson's too but for integers beyond 64 bits (see
    :data:`_WIDE_NUMBER`); json_problem has nothing to find (no \\u escape, too short to nest too
    deep). None otherwise."""
    blob = b"".join(lines)
    if b"\\" not in blob and max(map(len, lines)) <= 512 and _valid_utf8(blob):
        return blob
    return None


def _arrow_chunk(stream: str, lines: list[bytes], first: int, blob: bytes | None = None,
                 rule: TimestampRule = NO_BOUNDS) -> InputColumns | None:
    """The lines as Arrow columns when they are ordinary (:func:`_plain`), every line is one
    ``{...}`` and what Arrow's JSON reader reads is exact (:func:`_arrow_columns`); else None."""
    n = len(lines)
    blob = _plain(lines) if blob is None else blob
    if blob is not None and _objects_per_line(blob, lines):
        # Every line starts with { and ends with }: no value can span two lines (a } then a { is
        # never valid JSON inside a value), so one row per line means one object per line.
        return _arrow_columns(blob, n, first, stream, rule)
    return None


def _objects_per_line(blob: bytes, lines: list[bytes]) -> bool:
    """Whether every line (each ending in its newline; ``blob`` is them joined) starts with ``{``
    and ends with ``}``: two gathers at the line boundaries (a search of the blob for the byte pairs
    takes several times as long)."""
    sizes = np.fromiter(map(len, lines), np.int64, len(lines))
    ends = np.cumsum(sizes)
    data = np.frombuffer(blob, np.uint8)
    return bool((data[ends - sizes] == ord("{")).all() and (data[ends - 2] == ord("}")).all())


def _columns(stream: str, partition: int, first: int, lines: list[bytes],
             rule: TimestampRule = NO_BOUNDS) -> InputColumns:
    """The rows of ``lines`` (offsets from ``first``) as columns. A chunk of ordinary lines
    (:func:`_plain`) is parsed whole: by Arrow's JSON reader when every line is one ``{...}`` and what
    it reads is exact (:func:`_arrow_chunk`), else by orjson line by line in one C-level map (every
    line an object with a non-null key and a numeric or absent ts). Any other chunk, or one that
    fails those, is decoded line by line by :func:`_decode`. Timestamps are checked and converted by
    ``rule`` a column at a time; a chunk with one that ``rule`` refuses goes line by line, so that
    only its record is bad."""
    n = len(lines)
    blob = _plain(lines)
    if blob is not None:
        columns = _arrow_chunk(stream, lines, first, blob, rule)
        if columns is not None:
            return columns
        fast = _ORJSON_LOADS
        if fast is not None and _WIDE_NUMBER not in blob.translate(_DIGITS_AS_ZERO):
            try:
                rows = list(map(fast, lines))
                keys = list(map(_KEY, rows))  # TypeError for a row that is not an object
                if None not in keys:
                    values = list(map(dict.get, rows, repeat("value")))
                    times = list(map(dict.get, rows, repeat("ts")))
                    classes = set(map(type, times))
                    if not classes <= _PLAIN_TS:
                        if not classes <= _NUMERIC_TS:
                            raise ValueError("a ts to convert")  # a string, a bool: line by line
                        times = [None if ts is None else float(ts) for ts in times]
                    times = _checked_times(times, classes, rule)
                    return InputColumns(list(range(first, first + n)), keys, values, times, [], first + n)
            except Exception:  # noqa: BLE001 - any failure: the chunk goes line by line
                pass
    offsets: list[int] = []
    keys = []
    values = []
    times = []
    bad: list[InputRecord] = []
    for offset, line in enumerate(lines, first):
        record = _decode(stream, partition, offset, line, rule)
        if record.error is None:
            offsets.append(offset)
            keys.append(record.key)
            values.append(record.value)
            times.append(record.ts)
        else:
            bad.append(record)
    return InputColumns(offsets, keys, values, times, bad, first + n)


def _valid_utf8(blob: bytes) -> bool:
    try:
        blob.decode("utf-8")  # refuses what the per-line decoding refuses (bad bytes, encoded surrogates)
        return True
    except UnicodeDecodeError:
        return False


def _arrow_columns(blob: bytes, n: int, first: int, stream: str = "",
                   rule: TimestampRule = NO_BOUNDS) -> InputColumns | None:
    """The chunk's ``n`` lines parsed by Arrow's JSON reader, as Arrow columns, when that is exactly
    what the line-by-line decoding gives; None otherwise (the caller decodes another way).

    Exactly: one row per line (the caller checked that no value spans two lines; Arrow reads two objects
    on one line as two rows, so ``n`` rows mean one per line), a non-null ``key`` column of strings or integers, a ``ts`` column of finite numbers
    or nulls (a number ``ts`` is a float either way) that ``rule`` accepts (converted by it), and a ``value`` column (nulls: absent or
    null, as ``dict.get``) whose every leaf is a string, an integer, a boolean or null, with structs
    of one field and no null in a struct's field. Not exact, hence refused: floats anywhere in a value
    (Arrow widens ``1`` beside ``2.5``, and reads ``NaN``), structs of several fields (Arrow gives each
    row the first row's field order, and a field missing in a row becomes null), a key of another
    type, duplicate fields and a non-object line (Arrow raises).

    The schema Arrow inferred for the last chunk of ``stream`` this process took is tried first, as
    an explicit schema (no inference: a quarter of the parse), refusing fields outside it: a row that
    does not fit it (another type, another field) fails that parse, and the chunk is then read with
    inference as always. Either way the checks above decide."""
    pa, pj, pc = _arrow()
    if pa is None:
        return None
    options = pj.ReadOptions(use_threads=False, block_size=len(blob) + 1)
    errors = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
    table = None
    known = _SCHEMAS.get(stream)
    if known is not None:
        try:
            table = pj.read_json(pa.BufferReader(blob), read_options=options, parse_options=pj.ParseOptions(
                explicit_schema=known, unexpected_field_behavior="error"))
        except errors:
            table = None
    if table is None:
        try:
            table = pj.read_json(pa.BufferReader(blob), read_options=options)
        except errors:
            return None
    names = table.schema.names
    if table.num_rows != n or "key" not in names:
        return None

    def column(name: str) -> Any:
        return table.column(name).combine_chunks()

    key = column("key")
    if key.null_count or key.type not in (pa.string(), pa.int64()):
        return None
    if "value" in names:
        value = column("value")
        if not _exact_arrow_type(pa, value):
            return None
    else:
        value = pa.nulls(n)
    if "ts" in names:
        ts = column("ts")
        if ts.type == pa.int64():
            ts = pc.cast(ts, pa.float64(), safe=False)  # as float(int): the nearest double, beyond 2**53 too
        elif ts.type == pa.null():
            ts = pa.nulls(n, pa.float64())
        elif ts.type != pa.float64():
            return None
        if ts.null_count < n:
            if rule.per_second != 1.0:
                ts = pc.divide(ts, rule.per_second)
            ts = pc.add(ts, 0.0)  # -0.0 is 0.0, as TimestampRule.seconds gives it
            if not rule.column_fits(ts):
                return None
    else:
        ts = pa.nulls(n, pa.float64())
    if len(_SCHEMAS) > 64:
        _SCHEMAS.clear()
    _SCHEMAS[stream] = table.schema
    return InputColumns(range(first, first + n), key, value, ts, [], first + n)


def _exact_arrow_type(pa: Any, array: Any) -> bool:
    """Whether every row of ``array`` reads back as the json serde's decoder reads it (see
    :func:`_arrow_columns`)."""
    kind = array.type
    if kind in (pa.string(), pa.int64(), pa.bool_(), pa.null()):
        return True
    if pa.types.is_struct(kind):
        if kind.num_fields != 1:
            return False
        child = array.field(0)
        return child.null_count == 0 and _exact_arrow_type(pa, child)
    if pa.types.is_list(kind):
        return _exact_arrow_type(pa, array.flatten())
    return False


def _arrow() -> tuple[Any, Any, Any]:
    """pyarrow, its JSON reader and compute (imported when a batch task's input is first read), or
    Nones without pyarrow."""
    try:
        # CLI start-up: --help loads this module, not pyarrow (only a batch task's input needs it)
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        return None, None, None
    return pa, pj, pc


_SCHEMAS: dict[str, Any] = {}
"""input name -> the schema Arrow's JSON reader gave its last chunk that was exact (this process's;
tried first for the next chunk, see :func:`_arrow_columns`)."""
_KEY = itemgetter("key")
_PLAIN_TS = {type(None), float}
_NUMERIC_TS = {type(None), float, int}


def _checked_times(times: list[float | None], classes: set[type], rule: TimestampRule) -> list[float | None]:
    """A chunk's timestamps (floats or None, as orjson read them) in seconds, every one accepted by
    ``rule``; ValueError when one is not (the chunk then goes line by line)."""
    if classes <= {type(None)}:
        return times
    present = times if type(None) not in classes else [ts for ts in times if ts is not None]
    seconds = np.asarray(present, dtype=np.float64)
    if rule.per_second != 1.0:
        seconds = seconds / rule.per_second
    if not rule.column_fits(seconds):
        raise ValueError("a timestamp the input's rule refuses")
    if rule.per_second == 1.0 and not np.signbit(seconds[seconds == 0.0]).any():
        return times
    seconds = seconds + 0.0  # -0.0 is 0.0, as TimestampRule.seconds gives it
    converted = iter(seconds.tolist())
    return [None if ts is None else next(converted) for ts in times]


def _decode(stream: str, partition: int, offset: int, line: bytes, rule: TimestampRule = NO_BOUNDS) -> InputRecord:
    """The record of one line (with its newline): decoded by the json serde's decoder, or, if it is
    not a JSON object with a key (and a ``ts``, if any, that ``rule`` accepts), a bad record saying
    why. ``ts`` is converted to seconds by ``rule``."""
    try:
        text = line.decode("utf-8")
        try:
            data, stop = _SCAN(text, 0)
            if stop != len(text) - 1:
                raise ValueError("not one value per line")
        except (ValueError, StopIteration):
            data = _DECODER.decode(text)
        key = data["key"]
        if key is None:
            raise KeyError("key")
        if b"\\" in line or len(line) > 512:  # see json_problem: rarely true
            problem = json_problem(line, data)
            if problem is not None:
                raise ValueError(problem)
        ts = data.get("ts")
        if ts is not None:
            ts = rule.seconds(ts)
        return InputRecord(offset, key, data.get("value"), ts)
    except BadTimestamp as exc:
        return InputRecord(offset, None, None, None, exc.problem, line.decode("utf-8", "replace").rstrip("\n"))
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError,
            RecursionError) as exc:  # incl. UnicodeDecodeError, OverflowError
        reason = "missing key" if isinstance(exc, KeyError) else f"undecodable: {_text(exc)}"
        return InputRecord(offset, None, None, None, reason, line.decode("utf-8", "replace").rstrip("\n"))


class JsonLinesOutput(OutputStream):
    system = "jsonl"
    options: ClassVar[Mapping[str, Option]] = {
        "path": Option(str, parse=parse_path, doc="directory receiving <partition>.jsonl files (relative to the job file)"),
        "fsync": Option(bool, default=True, doc="fsync at every commit (durable outputs)"),
        "segment_bytes": Option((int, str), default=DEFAULT_SEGMENT_BYTES, parse=parse_size, minimum=1,
                                doc="roll a partition into a new segment file <partition>.<offset>.jsonl once its "
                                    "active one holds this many bytes ('64MiB'); segments are never deleted"),
    }

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self.directory = resolve_path(job, self.config["path"])
        self.segment_bytes: int = self.config["segment_bytes"]
        # partition -> (segment path, inode, size, complete lines) as this object's last append left it:
        # the next append counts its own lines on top instead of reading the whole segment again
        # (up to segment_bytes at every commit), as long as the file is just as that append left it.
        self._appended: dict[int, tuple[str, int, int, int]] = {}

    def location(self) -> tuple[str, str]:
        return "path", str(self.directory.resolve())

    def _active(self, partition: int) -> tuple[int, Path]:
        """``(base, path)`` of the segment appends go to: the last one (``<p>.jsonl`` until it rolls)."""
        segments = _segments(self.directory, partition)
        return segments[-1] if segments else (0, _file(self.directory, partition))

    def end_offset(self, partition: int) -> int:
        base, path = self._active(partition)
        check_output_file(path, stream=self.name, partition=partition)
        try:
            return base + _complete_lines(path)
        except OSError as exc:
            raise os_error(exc, "read output", path, OutputIOError, stream=self.name, partition=partition) from exc

    def truncate(self, partition: int, position: int) -> int:
        self._appended.pop(partition, None)
        segments = _segments(self.directory, partition)
        for _base, path in segments:
            check_output_file(path, stream=self.name, partition=partition)
        if len(segments) <= 1 and (not segments or segments[0][0] == 0):
            path = _file(self.directory, partition)
            check_output_file(path, stream=self.name, partition=partition)
            try:
                return self._truncate(path, position)
            except OSError as exc:
                raise os_error(exc, "roll back output", path, OutputIOError, stream=self.name,
                               partition=partition) from exc
        try:
            return self._truncate_segments(partition, segments, position)
        except OSError as exc:
            raise os_error(exc, "roll back output", self.directory, OutputIOError, stream=self.name,
                           partition=partition) from exc

    def _truncate_segments(self, partition: int, segments: list[tuple[int, Path]], position: int) -> int:
        """Roll a segmented partition back to ``position``: delete the segments that start at or after
        it (all written after the checkpoint; the newest first, so an interruption leaves a prefix),
        then truncate the one holding it. The segment holding ``position`` and the one before it must
        join up to it: otherwise a segment was deleted or truncated by hand (OutputError naming it).
        Segments wholly before the one holding ``position`` may be gone (read and deleted by the
        operator, see docs/operations.md): nothing here needs them."""
        first_base = segments[0][0]
        if position < first_base:
            first = _file(self.directory, partition) if first_base > 0 else segments[0][1]
            raise OutputError(f"output partition {partition}: the checkpoint's position {position} lies before its "
                              f"first segment {segments[0][1].name} (offset {first_base}): the segment holding it "
                              "was deleted by hand", stream=self.name, partition=partition, path=str(first),
                              offset=position,
                              hint="restore the segment from a backup; delete only segments whose lines all lie "
                                   "before the checkpoint's output position (docs/operations.md)")
        kept = [(base, path) for base, path in segments if base == first_base or base < position]
        base, path = kept[-1]
        lines = _complete_lines(path)
        if base + lines < position:
            raise OutputError(f"output segment {path} holds lines up to offset {base + lines}, but the checkpoint "
                              f"names offset {position}: the segment was truncated, or a segment after it deleted, "
                              "by hand", stream=self.name, partition=partition, path=str(path), offset=base + lines,
                              hint="restore the segments from a backup; localstate only deletes or truncates output "
                                   "segments written after the last checkpoint (rollback)")
        if len(kept) > 1:
            previous_base, previous = kept[-2]
            if previous_base + _complete_lines(previous) != base:
                _segment_gap(path, partition, base, previous_base + _complete_lines(previous), previous, self.name)
        removed = False
        for segment_base, segment in reversed(segments):
            if segment_base > first_base and segment_base >= position:
                segment.unlink()
                removed = True
        if removed:
            fsync_dir(self.directory)
        return base + self._truncate(path, position - base)

    @staticmethod
    def _truncate(path: Path, position: int) -> int:
        if not path.exists():
            return 0
        with os.fdopen(open_nofollow(path, os.O_RDWR), "r+b") as handle:
            data = handle.read()
            cut, lines = 0, 0
            while lines < position:
                newline = data.find(b"\n", cut)
                if newline < 0:
                    break
                cut, lines = newline + 1, lines + 1
            if cut < len(data):
                handle.truncate(cut)
                handle.flush()
                os.fsync(handle.fileno())
        return lines

    def append(self, partition: int, items: list[tuple[Any, Any]]) -> int:
        base, path = self._active(partition)
        check_output_file(path, stream=self.name, partition=partition)
        try:
            if items:
                self.directory.mkdir(parents=True, exist_ok=True)
                try:
                    full = os.stat(path).st_size >= self.segment_bytes
                except FileNotFoundError:
                    full = False
                if full:
                    # Roll: the next segment starts at this partition's end offset. Rollback deletes
                    # it again if the checkpoint of this batch is never written.
                    base = base + _complete_lines(path)
                    path = _segment_file(self.directory, partition, base)
                    check_output_file(path, stream=self.name, partition=partition)
                text = "".join(json.dumps({"key": k, "value": v}, separators=(",", ":"), sort_keys=True) + "\n"
                               for k, v in items).encode("utf-8")
                with os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as handle:
                    before = os.fstat(handle.fileno())
                    handle.write(text)
                    handle.flush()
                    if self.config["fsync"]:
                        os.fsync(handle.fileno())
                    size = os.fstat(handle.fileno()).st_size
                if full and self.config["fsync"]:
                    fsync_dir(self.directory)
                known = self._appended.get(partition)
                if known is not None and known[:3] == (str(path), before.st_ino, before.st_size) \
                        and size == before.st_size + len(text):
                    lines = known[3] + len(items)  # what the last append left, plus these lines
                else:
                    lines = _complete_lines(path)
                self._appended[partition] = (str(path), before.st_ino, size, lines)
                return base + lines
            known = self._appended.get(partition)
            if known is not None and known[0] == str(path):
                stat = os.stat(path)
                if (stat.st_ino, stat.st_size) == known[1:3]:
                    return base + known[3]
            return base + _complete_lines(path)
        except OSError as exc:
            # A partial line may be left behind; the next run's rollback truncates to the checkpoint.
            raise os_error(exc, "append to output", path, OutputIOError, stream=self.name,
                           partition=partition) from exc

    def read(self, partition: int) -> Iterator[tuple[Any, Any]]:
        """Every record of every segment of ``partition``, as one stream (OutputError naming a
        segment deleted or truncated by hand)."""
        try:
            records = read_jsonl(self.directory, partition)
        except OutputError as exc:
            exc.context.setdefault("stream", self.name)
            raise
        for record in records:
            yield record["key"], record["value"]


class JsonLinesStreams(StreamSystem):
    """``jsonl``: one JSON object per line, one file per partition."""

    description = "JSON-lines directories, one file per partition"
    input = JsonLinesInput
    output = JsonLinesOutput
