"""One partition of a file changelog: a directory of segment files, one writer, any number of readers.

Guarantees:
- ``flush()`` returns only after every appended record is written (and fsynced when ``fsync``);
  offsets are assigned at append, consecutive.
- A writer takes an exclusive ``flock`` on ``writer.lock``; a second writer fails with ChangelogError.
- On open, a writer truncates a torn tail (incomplete/invalid records at the end of the last segment
  with nothing valid after them) and logs a warning. Any other invalid record raises
  ChangelogCorruptError; nothing is ever skipped silently.
- Readers take no lock, re-list segments as they go and never yield a record twice or out of order,
  nor skip one, also while another object/process appends or compaction swaps segment files: a reader
  leaves a segment only once a newer one exists (the writer completes a segment before creating the
  next) and it has read the segment to its end after seeing that.
- Gaps between segments are read through only if compaction recorded them (``compaction.json``);
  a segment deleted by anything else raises ChangelogCorruptError naming it and the offsets lost, and
  a writer does not resume on a last segment that compaction saw followed by others.
- ``roll()`` (writer) seals the active segment so compaction can reach its records.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import time
import zlib
from itertools import chain
from pathlib import Path
from typing import Callable, Generator, Iterable, Iterator, TypeVar

from localstate.core.changelog import ChangelogPartition, ChangelogRecord, RecordColumns
from localstate.core.fsutil import fsync_dir, open_nofollow, read_nofollow
from localstate.errors import ChangelogCorruptError, ChangelogError

from localstate.changelog.framing import (
    HEADER,
    HEADER_SIZE,
    count_records,
    decode_columns,
    decode_records,
    encode_into,
    find_valid_after,
    split_point,
    valid_record_at,
    walk,
)

from .compaction import CompactionManifest, check_gap, check_last_segment
from .format import list_segments, segment_name

__all__ = ["FileChangelogPartition", "DEFAULT_SEGMENT_BYTES", "LOCK_FILE"]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 << 20
LOCK_FILE = "writer.lock"
_CHUNK = 8 << 20          # bytes per read() of a segment file
_BATCH_BYTES = 64 << 10   # bytes decoded into one batch (small batches: records die young, less GC work)
_MARK_BYTES = 1 << 20     # spacing of remembered record positions (fast seeks for followers)
_NO_STOP = 1 << 64
Batch = TypeVar("Batch", list[ChangelogRecord], RecordColumns)
#: A batch decoder: ``(buf, pos, limit, expected, stop) -> (batch, pos after it, next expected offset)``.
Decoder = Callable[[bytes, int, int, int, int], tuple[Batch, int, int]]
_CORRUPT_HINT = ("the changelog segment is damaged (disk error or manual edit); restore this partition "
                 "directory from a backup, or if the job's local state is intact, stop the job and "
                 "re-create the changelog from it; do not delete records by hand")


class FileChangelogPartition(ChangelogPartition):
    """A file-backed changelog partition. ``writable=False`` opens a lock-free reader."""

    def __init__(self, directory: Path, stream: str = "changelog", partition: int = 0, *,
                 writable: bool = True, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.stream = stream
        self.partition = partition
        self.writable = writable
        self.segment_bytes = max(1, int(segment_bytes))
        self.fsync = fsync
        self._buf = bytearray()
        self._closed = False
        self._lock_fd: int | None = None
        self._fd: int | None = None          # active segment, writer only
        self._active_size = 0
        self._flushed_end = 0
        self._next = 0
        self._end_cache: tuple[int, int, int, int] | None = None  # reader: (base, ino, pos, end)
        # Reader: per segment base, remembered (offset, byte position) of record starts, ascending.
        self._marks: dict[int, list[tuple[int, int]]] = {}
        if writable:
            self._open_writer()

    # ------------------------------------------------------------------ writer

    def _open_writer(self) -> None:
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.fsync:  # make the new directory entries durable (stream dir, partition dir)
                fsync_dir(self.directory.parent)
                fsync_dir(self.directory.parent.parent)
        lock_fd = open_nofollow(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise ChangelogError(
                "changelog partition is already open for writing", stream=self.stream,
                partition=self.partition, path=str(self.directory),
                hint="only one writer per partition: close the other FileChangelogPartition or stop the "
                     "other job instance using this state directory; use reader() to read concurrently") from None
        self._lock_fd = lock_fd
        try:
            self._recover()
        except BaseException:
            self._release()
            raise

    def _recover(self) -> None:
        """Find the end of the last segment, truncating a torn tail."""
        bases = list_segments(self.directory)
        if not bases:
            self._flushed_end = self._next = 0
            return
        base = bases[-1]
        path = self.directory / segment_name(base)
        data = read_nofollow(path)
        valid_end, next_offset, bad = walk(data, 0, base)
        if bad is not None:
            found = find_valid_after(data, bad, next_offset)
            if found is not None:
                raise ChangelogCorruptError(
                    "changelog record failed its integrity check and valid records follow it",
                    stream=self.stream, partition=self.partition, offset=next_offset, segment=str(path),
                    byte=bad, hint=_CORRUPT_HINT)
            dropped = len(data) - valid_end
            log.warning("changelog %s partition %d: truncating torn tail at offset %d: %d bytes dropped "
                        "from %s (an unflushed write was interrupted)", self.stream, self.partition,
                        next_offset, dropped, path)
            with os.fdopen(open_nofollow(path, os.O_RDWR), "r+b") as f:
                f.truncate(valid_end)
                f.flush()
                os.fsync(f.fileno())
        check_last_segment(self.directory, base, stream=self.stream, partition=self.partition)
        self._fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND)
        self._active_size = valid_end
        self._flushed_end = self._next = next_offset

    def _check_writable(self) -> None:
        if self._closed:
            raise ChangelogError("changelog partition is closed", stream=self.stream, partition=self.partition,
                                 hint="open the partition again")
        if not self.writable:
            raise ChangelogError("changelog partition was opened read-only", stream=self.stream,
                                 partition=self.partition, hint="use FileChangelogSystem.partition() to write")

    def append(self, key: bytes, value: bytes | None) -> None:
        self.append_many(((key, value),))

    def append_many(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        if not self.writable or self._closed:
            self._check_writable()
        buf = self._buf
        start = len(buf)
        try:
            self._next = encode_into(buf, records, self._next, int(time.time() * 1000))
        except Exception as exc:  # struct.error, TypeError, OverflowError: not bytes / too long
            # Records appended before the bad one stay buffered, whole (append semantics, in order).
            self._next += count_records(buf, start)
            raise ChangelogError(f"cannot append record: {exc}", stream=self.stream, partition=self.partition,
                                 offset=self._next, hint="keys and values must be bytes; keys < 4 GiB, "
                                 "values < 2 GiB") from exc

    def end_offset(self) -> int:
        if self.writable:
            return self._next
        return self._disk_end()

    def flush(self) -> int:
        self._check_writable()
        buf = self._buf
        if buf:
            n = len(buf)
            pos = 0
            offset = self._flushed_end
            try:
                with memoryview(buf) as view:
                    while pos < n:
                        if self._fd is None or self._active_size >= self.segment_bytes:
                            self._roll(offset)
                        cut, cut_offset = n, self._next
                        room = self.segment_bytes - self._active_size
                        if n - pos > room:
                            cut, cut_offset = split_point(buf, pos, room)
                        self._write_all(view[pos:cut])
                        pos, offset = cut, cut_offset
                if self.fsync:
                    os.fsync(self._fd)  # type: ignore[arg-type]
            except OSError as exc:
                self._fail()
                raise ChangelogError(f"changelog write failed: {exc}", stream=self.stream,
                                     partition=self.partition, offset=offset,
                                     hint="check free disk space and permissions, then restart the task; "
                                          "reopening the partition recovers its tail") from exc
            buf.clear()
            self._flushed_end = self._next
        return self._flushed_end

    def roll(self) -> bool:
        """Writer: flush, then seal the active segment (if it holds records) and start a new, empty one,
        so compaction can reach the records that were in it. Returns True if a segment was sealed."""
        self.flush()
        if self._fd is None or self._active_size == 0:
            return False
        try:
            self._roll(self._flushed_end)
        except OSError as exc:
            self._fail()
            raise ChangelogError(f"cannot roll the changelog segment: {exc}", stream=self.stream,
                                 partition=self.partition, offset=self._flushed_end,
                                 hint="check free disk space and permissions, then restart the task") from exc
        return True

    def compaction_horizon(self) -> int:
        """1 + the highest offset of a tombstone compaction dropped (0: none). Local state whose
        offset is below it missed a delete that is no longer in the changelog: it must be rebuilt."""
        return CompactionManifest.load(self.directory, self.stream, self.partition).horizon

    def _write_all(self, data: memoryview) -> None:
        fd = self._fd
        assert fd is not None
        written = 0
        total = len(data)
        while written < total:
            written += os.write(fd, data[written:])
        self._active_size += total

    def _roll(self, base: int) -> None:
        """Seal the active segment and start a new one whose first offset is ``base``."""
        if self._fd is not None:
            if self.fsync:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        path = self.directory / segment_name(base)
        self._fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        self._active_size = 0
        if self.fsync:
            fsync_dir(self.directory)

    def _fail(self) -> None:
        """After a write error the in-memory state is unknown: refuse further use of this writer."""
        self._closed = True
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None

    def close(self) -> None:
        """Close files and release the writer lock. Unflushed records are dropped."""
        if self._closed:
            return
        self._closed = True
        self._buf = bytearray()
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
        finally:
            self._release()  # the writer lock is released even if closing the segment failed

    def __enter__(self) -> "FileChangelogPartition":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ readers

    def flushed_end(self) -> int:
        """Writer: end offset of the durable records. Reader: same as end_offset()."""
        return self._flushed_end if self.writable else self._disk_end()

    def _disk_end(self) -> int:
        """End offset of the valid records on disk (a torn or in-progress tail is not counted).
        Incremental: continues from the previous call's position while the last segment is the same file."""
        bases = list_segments(self.directory)
        if not bases:
            return 0
        base = bases[-1]
        path = self.directory / segment_name(base)
        try:
            with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:
                st = os.fstat(f.fileno())
                pos, expected = 0, base
                cache = self._end_cache
                if cache and cache[0] == base and cache[1] == st.st_ino and st.st_size >= cache[2]:
                    pos, expected = cache[2], cache[3]
                    f.seek(pos)
                data = f.read()
        except FileNotFoundError:
            return self._disk_end()
        valid_end, next_offset, _bad = walk(data, 0, expected)
        self._end_cache = (base, st.st_ino, pos + valid_end, next_offset)
        return next_offset

    def read(self, start: int = 0, end: int | None = None) -> Iterator[ChangelogRecord]:
        """Records with ``start <= offset < end``. ``end=None``: a writer reads up to its flushed end;
        a reader reads whatever valid records exist on disk while it iterates (it follows appends)."""
        # Records are decoded in batches; chain() hands them out without a Python step per record.
        return chain.from_iterable(self.read_batches(start, end))

    def read_batches(self, start: int = 0, end: int | None = None) -> Iterator[list[ChangelogRecord]]:
        """The records of :meth:`read` in lists, one per block of about 64 KiB decoded at once
        (the bulk path: no generator step per record). Each list is new and belongs to the caller."""
        return self._batches(*self._range(start, end), decode_records)

    def read_columns(self, start: int = 0, end: int | None = None) -> Iterator[RecordColumns]:
        """The records of :meth:`read` as :class:`RecordColumns` runs, decoded straight into key and
        value lists (no object per record): the restore path. Same checks and errors as :meth:`read`."""
        return self._batches(*self._range(start, end), decode_columns)

    def _range(self, start: int, end: int | None) -> tuple[int, int | None]:
        """``(start, stop)`` of a read, checked: a closed partition refuses; a writer reads up to its
        flushed end."""
        if self._closed:
            raise ChangelogError("changelog partition is closed", stream=self.stream, partition=self.partition,
                                 hint="open the partition again")
        if self.writable:
            end = self._flushed_end if end is None else min(end, self._flushed_end)
        return max(0, start), end

    def _batches(self, start: int, stop: int | None, decode: "Decoder[Batch]") -> Iterator[Batch]:
        nxt = start
        bases = list_segments(self.directory)
        if len(self._marks) > len(bases):  # forget the positions of segments compaction deleted
            live = set(bases)
            self._marks = {b: m for b, m in self._marks.items() if b in live}
        index = max(0, bisect.bisect_right(bases, nxt) - 1)
        self._check_start(bases, nxt, stop)
        while index < len(bases):
            if stop is not None and nxt >= stop:
                return
            base = bases[index]
            path = self.directory / segment_name(base)
            try:
                f = os.fdopen(open_nofollow(path, os.O_RDONLY), "rb", buffering=0)
            except FileNotFoundError:
                # Compaction deleted a segment that became empty: re-list and continue at nxt.
                bases = list_segments(self.directory)
                index = max(0, bisect.bisect_right(bases, nxt) - 1)
                if index < len(bases) and bases[index] == base:
                    raise ChangelogError("segment vanished while reading", stream=self.stream,
                                         partition=self.partition, segment=str(path),
                                         hint="another process is deleting changelog files; stop it") from None
                self._check_start(bases, nxt, stop)
                continue
            with f:
                nxt, finished = yield from self._segment_batches(f, path, base, nxt, stop,
                                                                 index < len(bases) - 1, decode)
            if finished:
                return
            # The segment was read to its end and a newer one exists (the segment was sealed).
            if index == len(bases) - 1:
                bases = list_segments(self.directory)
            index = bisect.bisect_right(bases, base)
            if index < len(bases) and nxt < bases[index] and (stop is None or nxt < stop):
                # The next segment must continue where this one ended, unless compaction recorded
                # that it removed the offsets in between: a segment deleted by anyone else is loss.
                target = bases[index] if stop is None else min(bases[index], stop)
                check_gap(self.directory, base, nxt, target, stream=self.stream, partition=self.partition)

    def _check_start(self, bases: list[int], nxt: int, stop: int | None) -> None:
        """Offsets from ``nxt`` up to the first segment are missing: only compaction may remove them."""
        if bases and nxt < bases[0] and (stop is None or nxt < stop):
            check_gap(self.directory, None, nxt, bases[0] if stop is None else min(bases[0], stop),
                      stream=self.stream, partition=self.partition)

    def _segment_batches(self, f, path: Path, base: int, nxt: int, stop: int | None,  # noqa: ANN001
                         sealed: bool, decode: "Decoder[Batch]") -> Generator[Batch, None, tuple[int, bool]]:
        """Yield the records of one segment file with ``nxt <= offset < stop``, in batches made by
        ``decode`` (record lists or columns; an empty batch is falsy).

        ``sealed``: a newer segment is known to exist, so this file is complete. Returns
        ``(next offset, finished)``; ``finished`` is False only when the whole segment was read and the
        next segment follows; True when ``stop`` was reached or this is the last segment and its end
        (for now) was reached.
        """
        unpack = HEADER.unpack_from
        hs = HEADER_SIZE
        stop_ = _NO_STOP if stop is None else stop
        expected, buf_pos = self._start_position(f, base, nxt)  # expected: lowest offset the next record may carry
        marks = self._marks.setdefault(base, [])
        next_mark = (marks[-1][1] if marks else 0) + _MARK_BYTES
        buf = b""   # bytes of the file from position buf_pos on
        i = 0       # position in buf of the next record
        while True:
            chunk = f.read(_CHUNK)
            if chunk:
                buf = buf[i:] + chunk if i < len(buf) else chunk
                buf_pos += i
                i = 0
            n = len(buf)
            last = n - hs + 1  # a record starting before ``last`` has a complete header
            # Seek: walk headers only (no crc, no objects) up to the first wanted offset.
            while expected < nxt and i < last:
                _crc, off, _ts, klen, vlen = unpack(buf, i)
                end = i + hs + klen + (vlen if vlen > 0 else 0)
                if end > n or off >= nxt or off < expected:
                    break
                expected = off + 1
                i = end
            bad = False
            while True:
                first = i
                records, i, expected = decode(buf, i, min(i + _BATCH_BYTES, last), expected, stop_)
                if records:
                    if buf_pos + first >= next_mark and (not marks or marks[-1][1] < buf_pos + first):
                        marks.append((unpack(buf, first)[1], buf_pos + first))
                        next_mark = buf_pos + first + _MARK_BYTES
                    nxt = expected
                    yield records
                    if expected >= stop_:  # do not look at (possibly damaged) bytes past the range
                        return nxt, True
                # the decoder stopped at the batch limit, or at a record that is incomplete, invalid or >= stop.
                if i >= last:
                    break
                crc, off, _ts, klen, vlen = unpack(buf, i)
                end = i + hs + klen + (vlen if vlen > 0 else 0)
                if end > n:
                    break
                if off >= expected and zlib.crc32(memoryview(buf)[i + 4:end]) == crc:
                    if off >= stop_:
                        return max(nxt, expected), True
                    continue
                bad = True
                break
            if not bad and chunk:
                continue  # an incomplete record at i: read more bytes
            if bad:
                # Take in the rest of the file to tell a torn tail (nothing valid follows) from corruption.
                buf = buf[i:] + f.read()
                buf_pos += i
                i = 0
            tail = i < len(buf)  # bytes that are not a valid record are left at the end of the file
            # A damaged length field can make a record look incomplete: look for valid records after it.
            if tail and find_valid_after(buf, i, expected) is not None:
                self._corrupt(path, expected, buf_pos + i)
            if not sealed:
                # The writer completes a segment before it creates the next one. No newer segment: this
                # is the end of the data for now (a tail may be in progress, or torn and truncated when
                # a writer opens). A newer segment: this file is complete now, so read what was
                # appended since our last read before moving on (never skip it).
                if not any(b > base for b in list_segments(self.directory)):
                    return max(nxt, expected), True
                sealed = True
                continue
            if tail:
                self._corrupt(path, expected, buf_pos + i)
            return max(nxt, expected), False

    def _start_position(self, f, base: int, nxt: int) -> tuple[int, int]:  # noqa: ANN001
        """``(expected offset, byte position)`` to start scanning segment ``base`` for offset ``nxt``.

        The last remembered record position at or before ``nxt`` if a valid record with the remembered
        offset is still there, else the start of the file. Checking the record, not the file's identity,
        is what makes this safe when compaction rewrites the segment (even if the new file reuses the
        inode number): offsets increase within a file, so every record before a valid record with
        offset ``o`` has an offset below ``o``."""
        marks = self._marks.get(base)
        if not marks:
            return base, 0
        at = bisect.bisect_right(marks, (nxt, _NO_STOP)) - 1
        if at < 0:
            return base, 0
        offset, pos = marks[at]
        fd = f.fileno()
        size = os.fstat(fd).st_size
        head = os.pread(fd, HEADER_SIZE, pos)
        if len(head) == HEADER_SIZE:
            _crc, off, _ts, klen, vlen = HEADER.unpack(head)
            length = HEADER_SIZE + klen + max(vlen, 0)
            if off == offset <= nxt and pos + length <= size and valid_record_at(os.pread(fd, length, pos), 0, off):
                f.seek(pos)
                return offset, pos
        del self._marks[base]  # the file was rewritten: its old positions mean nothing
        return base, 0

    def _corrupt(self, path: Path, offset: int, byte: int) -> None:
        raise ChangelogCorruptError(
            "changelog record failed its integrity check", stream=self.stream, partition=self.partition,
            offset=offset, segment=str(path), byte=byte, hint=_CORRUPT_HINT)
